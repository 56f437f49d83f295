import { availableParallelism } from 'node:os'
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
    // One test file more than the cores, three at least: most files wait on sockets, timers and
    // child processes more than they compute. On a 2-core machine the suite took 441 s with one
    // file at a time, 390 s with two and 316 s with three (2026-12-04), which keeps CI within its
    // 15 minutes with room to spare. Files share nothing but the services, under random Redis key
    // prefixes and PostgreSQL schemas, and ports of their own (test/helpers/redis.ts,
    // postgres.ts, the cluster tests).
    maxWorkers: Math.max(3, availableParallelism() + 1),
  },
})
