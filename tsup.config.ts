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
  // Built-ins keep their `node:` prefix: Workers (nodejs_compat) and Deno resolve `node:crypto`,
  // and bundlers for them leave it to the runtime, where a bare `crypto` is looked up as a package.
  removeNodeProtocol: false,
})
