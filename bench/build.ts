/**
 * Bundles the benchmark entries (micro suite, HTTP servers, load generator) with esbuild
 * into `node_modules/.cache/mcp-dispatch-bench/`, and they run there on plain `node`.
 *
 * Why not run them under tsx: tsx transforms with esbuild's `keepNames`, which wraps every
 * function created at run time in `__name(fn, "…")` (an `Object.defineProperty` per closure).
 * On the dispatcher's hot path that was a quarter of the measured time, a cost the published
 * build (tsup, no `keepNames`) does not have. The bundle here is built like the package:
 * ESM, `node20`, no `keepNames`; `mcp-dispatch` and its subpaths come from `src/` (tsconfig
 * paths), every other package stays an external import from `node_modules`.
 *
 * An adapter whose source does not exist yet (`src/adapters/<name>/index.ts`) resolves to a
 * stub that says so, and the benchmarks that need it are reported as not available.
 */
import { existsSync, mkdirSync, realpathSync, rmSync } from 'node:fs'
import { dirname, join, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'
import { type Plugin, build } from 'esbuild'

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..')
/** Where the bundles go: inside node_modules, so their bare imports resolve from the project. */
export const OUT_DIR = join(ROOT, 'node_modules', '.cache', 'mcp-dispatch-bench')

/** The entries that run as their own processes. */
export const ENTRIES = {
  micro: 'bench/micro.ts',
  server: 'bench/servers/main.ts',
  load: 'bench/load.ts',
  profile: 'bench/profile-decision.ts',
  paths: 'bench/paths.ts',
} as const

/** Source file of a public `mcp-dispatch` specifier. */
export function sourceOf(specifier: string): string | undefined {
  if (specifier === 'mcp-dispatch') return join(ROOT, 'src', 'index.ts')
  const sub = /^mcp-dispatch\/([a-z-]+)$/.exec(specifier)?.[1]
  if (!sub) return undefined
  return join(ROOT, 'src', sub === 'redis' || sub === 'postgres' ? 'stores' : 'adapters', sub, 'index.ts')
}

const resolvePackage: Plugin = {
  name: 'mcp-dispatch-bench-resolve',
  setup(b) {
    b.onResolve({ filter: /^[^./]/ }, (args) => {
      if (args.path.startsWith('node:')) return { external: true }
      const source = sourceOf(args.path)
      if (source === undefined) return { external: true }
      if (existsSync(source)) return { path: source }
      return { path: args.path, namespace: 'unavailable' }
    })
    b.onLoad({ filter: /.*/, namespace: 'unavailable' }, (args) => ({
      contents: `export const __unavailable = ${JSON.stringify(`${args.path}: ${sourceOf(args.path)?.slice(ROOT.length + 1)} does not exist`)}`,
      loader: 'js',
    }))
  },
}

/** Builds every entry; returns the path of each bundle by entry name. */
export async function buildBench(): Promise<Record<keyof typeof ENTRIES, string>> {
  rmSync(OUT_DIR, { recursive: true, force: true })
  mkdirSync(OUT_DIR, { recursive: true })
  await build({
    absWorkingDir: ROOT,
    entryPoints: Object.fromEntries(Object.entries(ENTRIES).map(([name, file]) => [name, file])),
    outdir: OUT_DIR,
    outExtension: { '.js': '.mjs' },
    bundle: true,
    format: 'esm',
    platform: 'node',
    target: 'node20',
    keepNames: false,
    sourcemap: 'linked',
    logLevel: 'warning',
    plugins: [resolvePackage],
  })
  // By their real path: `node_modules` may be a symlink (a git worktree sharing another
  // checkout's), and the micro entry knows it is the main module by comparing `argv[1]` with
  // its `import.meta.url`, which Node resolves through symlinks.
  const dir = realpathSync(OUT_DIR)
  return Object.fromEntries(Object.keys(ENTRIES).map((name) => [name, join(dir, `${name}.mjs`)])) as Record<
    keyof typeof ENTRIES,
    string
  >
}
