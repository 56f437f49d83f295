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
    // Two test files at a time at least: vitest's default (one fewer than the cores) runs one
    // at a time on a 2-core machine, where most files wait on sockets, timers and child
    // processes more than they compute (the suite took 441 s there with one, 225 s with two).
    // Files share nothing but the services, under random Redis key prefixes and PostgreSQL
    // schemas, and ports of their own (test/helpers/redis.ts, postgres.ts, the cluster tests).
    maxWorkers: Math.max(2, availableParallelism() - 1),
  },
})
