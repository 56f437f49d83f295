/**
 * Runs before the test files, once per vitest project, one after another (the root's and the
 * two of vitest.config.ts: the later runs find `dist/` fresh and return): builds `dist/` when
 * it is missing (a clean clone) or older than a source file of the package (a change to `src/`
 * since the last build), so that `npm ci && npm test` runs the suites that check the package
 * as it is published (its exports, its declarations, the docs' samples against them, the
 * runtimes and the reference platform that import it) on the code as it is, instead of
 * skipping them or testing an earlier build (regression: a fix in `src/` passed its unit test
 * while the platform, importing `dist/`, still ran the code before it). The build goes to a
 * directory of its own and is renamed into place whole, so a test never reads a `dist/` half
 * written, and two runs started at once each build their own and the first in keeps its.
 * `.ci/run` builds first, so there it is used as it is.
 */
import { execFileSync } from 'node:child_process'
import { existsSync, readdirSync, renameSync, rmSync, statSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'

const root = fileURLToPath(new URL('..', import.meta.url))
const built = () => existsSync(`${root}dist/index.js`) && existsSync(`${root}dist/index.d.ts`) && existsSync(`${root}dist/index.d.cts`)

/** The latest modification time (ms) of the files tsup builds from: `src/`, tests left out, and its configuration. */
function sourcesChangedAt(): number {
  let latest = Math.max(statSync(`${root}tsup.config.ts`).mtimeMs, statSync(`${root}package.json`).mtimeMs)
  for (const entry of readdirSync(`${root}src`, { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || !entry.name.endsWith('.ts') || entry.name.endsWith('.test.ts')) continue
    latest = Math.max(latest, statSync(join(entry.parentPath, entry.name)).mtimeMs)
  }
  return latest
}

export default function setup(): void {
  if (built() && statSync(`${root}dist/index.js`).mtimeMs >= sourcesChangedAt()) return
  console.warn(`[global-setup] dist/ is ${built() ? 'older than src/' : 'missing'}: building it (tsup) before the tests`)
  const building = `dist.building-${process.pid}`
  try {
    execFileSync('npx', ['tsup'], { cwd: root, stdio: ['ignore', 'inherit', 'inherit'], env: { ...process.env, MCP_DISPATCH_OUT_DIR: building } })
    // Another run put a build of these sources in place meanwhile: its tests may be reading it.
    if (built() && statSync(`${root}dist/index.js`).mtimeMs >= sourcesChangedAt()) return
    rmSync(`${root}dist`, { recursive: true, force: true })
    renameSync(`${root}${building}`, `${root}dist`)
  } finally {
    rmSync(`${root}${building}`, { recursive: true, force: true })
  }
}
