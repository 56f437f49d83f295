import { fileURLToPath } from 'node:url'
import { configDefaults, defineConfig } from 'vitest/config'

const src = (path: string) => fileURLToPath(new URL(`./src/${path}`, import.meta.url))

export default defineConfig({
  resolve: {
    // Examples and tests import the package by its public name, as users do.
    alias: [
      { find: /^mcp-dispatch$/, replacement: src('index.ts') },
      { find: /^mcp-dispatch\/(web|express|fastify|proxy)$/, replacement: src('adapters/$1/index.ts') },
      { find: /^mcp-dispatch\/(redis|postgres)$/, replacement: src('stores/$1/index.ts') },
    ],
  },
  test: {
    include: ['src/**/*.test.ts', 'test/**/*.test.ts', 'examples/**/*.test.ts', 'bench/**/*.test.ts'],
    // The conformance runner's own install (npm ci --prefix test/conformance) ships test files;
    // Next.js's build output is no test.
    exclude: [...configDefaults.exclude, 'test/conformance/node_modules/**', 'test/runtimes/node_modules/**', 'test/nextjs/node_modules/**', 'test/node24/node_modules/**', 'test/nextjs/.next/**'],
    // Builds dist/ when it is missing (a clean clone): the package suites check what is published.
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    pool: 'forks',
  },
})
