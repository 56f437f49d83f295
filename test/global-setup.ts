/**
 * Runs once before any test file: builds `dist/` when it is missing (a clean clone), so that
 * `npm ci && npm test` runs the suites that check the package as it is published (its exports,
 * its declarations, the docs' samples against them, the runtimes that import it) instead of
 * skipping them. A `dist/` already there is used as it is: after a change to `src/`, run
 * `npm run build` again (`.ci/run` always does).
 */
import { execFileSync } from 'node:child_process'
import { existsSync } from 'node:fs'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))

export default function setup(): void {
  if (existsSync(`${root}dist/index.js`) && existsSync(`${root}dist/index.d.ts`)) return
  console.warn('[global-setup] dist/ is missing: building it (npm run build) before the tests')
  execFileSync('npm', ['run', 'build'], { cwd: root, stdio: ['ignore', 'inherit', 'inherit'] })
}
