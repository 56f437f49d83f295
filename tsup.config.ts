import { existsSync } from 'node:fs'
import { defineConfig } from 'tsup'

const entries: Record<string, string> = {
  index: 'src/index.ts',
  'adapters/web/index': 'src/adapters/web/index.ts',
  'adapters/express/index': 'src/adapters/express/index.ts',
  'adapters/fastify/index': 'src/adapters/fastify/index.ts',
  'adapters/proxy/index': 'src/adapters/proxy/index.ts',
  'stores/redis/index': 'src/stores/redis/index.ts',
  'stores/postgres/index': 'src/stores/postgres/index.ts',
}

export default defineConfig({
  // A store subpath is built once its source exists (they are written on their own branches;
  // bench/build.ts does the same).
  entry: Object.fromEntries(Object.entries(entries).filter(([, source]) => existsSync(source))),
  format: ['esm', 'cjs'],
  dts: true,
  sourcemap: true,
  clean: true,
  target: 'node20',
  splitting: true,
  treeshake: true,
})
