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
    // Three test files at a time at least: vitest's default (one fewer than the cores) runs one
    // at a time on a 2-core machine, where most files wait on sockets, timers and child
    // processes more than they compute (the suite once took 441 s there with one, 225 s with
    // two; on 2026-12-02's slower host 504 s with two, 407 and 416 s with three, and 451 s
    // with four, one request of the load test then left unanswered for 30 s). The suite also
    // passes with two files at a time beside two busy loops, a heavier load than three.
    // Files share nothing but the services, under random Redis key prefixes and PostgreSQL
    // schemas, and ports of their own (test/helpers/redis.ts, postgres.ts, the cluster tests).
    maxWorkers: Math.max(3, availableParallelism() - 1),
  },
})
