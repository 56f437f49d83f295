import { readFile, readdir, writeFile } from 'node:fs/promises'
import { join } from 'node:path'
import { defineConfig } from 'tsup'

/**
 * Leaves one `//# sourceMappingURL` comment per file: with `treeshake`, tsup's Rollup pass
 * writes a second one after the first, which source-map tools and bundlers warn about.
 */
async function oneSourceMapComment(dir: string): Promise<void> {
  for (const entry of await readdir(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name)
    if (entry.isDirectory()) await oneSourceMapComment(path)
    else if (/\.c?js$/.test(entry.name)) {
      const text = await readFile(path, 'utf8')
      const fixed = text.replace(REPEATED_SOURCE_MAP_COMMENT, '$1\n')
      if (fixed !== text) await writeFile(path, fixed)
    }
  }
}
const REPEATED_SOURCE_MAP_COMMENT = /(\n\/\/# sourceMappingURL=[^\n]*)(?:\n?\/\/# sourceMappingURL=[^\n]*)+\n?$/

/**
 * Where the build goes: `dist`, or another directory for a build to be renamed into place whole
 * (test/global-setup.ts sets `MCP_DISPATCH_OUT_DIR`; tsup's `--out-dir` would leave
 * `onSuccess` fixing the files of `dist`).
 */
const outDir = process.env.MCP_DISPATCH_OUT_DIR || 'dist'

export default defineConfig({
  outDir,
  entry: {
    index: 'src/index.ts',
    'adapters/web/index': 'src/adapters/web/index.ts',
    'adapters/express/index': 'src/adapters/express/index.ts',
    'adapters/fastify/index': 'src/adapters/fastify/index.ts',
    'adapters/proxy/index': 'src/adapters/proxy/index.ts',
    'stores/redis/index': 'src/stores/redis/index.ts',
    'stores/postgres/index': 'src/stores/postgres/index.ts',
  },
  format: ['esm', 'cjs'],
  dts: true,
  sourcemap: true,
  clean: true,
  target: 'node20',
  splitting: true,
  treeshake: true,
  // Built-ins keep their `node:` prefix: Workers (nodejs_compat) and Deno resolve `node:crypto`,
  // and bundlers for them leave it to the runtime, where a bare `crypto` is looked up as a package.
  removeNodeProtocol: false,
  onSuccess: () => oneSourceMapComment(outDir),
})
