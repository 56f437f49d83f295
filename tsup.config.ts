import { defineConfig } from 'tsup'

export default defineConfig({
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
})
