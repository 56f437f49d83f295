/**
 * Runs once before any test file: builds `dist/` when it is missing (a clean clone), so that
 * `npm ci && npm test` runs the suites that check the package as it is published (its exports,
 * its declarations, the docs' samples against them, the runtimes that import it) instead of
 * skipping them. The build goes to a directory of its own and is renamed into place whole, so
 * a test never reads a `dist/` half written, and two runs started at once each build their own
 * and the first in keeps its. A `dist/` already there is used as it is: after a change to
 * `src/`, run `npm run build` again (`.ci/run` always does).
 */
import { execFileSync } from 'node:child_process'
import { existsSync, renameSync, rmSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const built = () => existsSync(`${root}dist/index.js`) && existsSync(`${root}dist/index.d.ts`) && existsSync(`${root}dist/index.d.cts`)

export default function setup(): void {
  if (built()) return
  console.warn('[global-setup] dist/ is missing: building it (tsup) before the tests')
  const building = `dist.building-${process.pid}`
  try {
    execFileSync('npx', ['tsup', '--out-dir', building], { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] })
    if (built()) return // another run put its build in place meanwhile
    rmSync(`${root}dist`, { recursive: true, force: true }) // a partial one (an interrupted build)
    renameSync(`${root}${building}`, `${root}dist`)
  } finally {
    rmSync(`${root}${building}`, { recursive: true, force: true })
  }
}
