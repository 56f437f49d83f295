import { availableParallelism } from 'node:os'
import { fileURLToPath } from 'node:url'
import { configDefaults, defineConfig } from 'vitest/config'

const src = (path: string) => fileURLToPath(new URL(`./src/${path}`, import.meta.url))

const TEST_FILES = ['src/**/*.test.ts', 'test/**/*.test.ts', 'examples/**/*.test.ts', 'bench/**/*.test.ts']
// The conformance runner's own install (npm ci --prefix test/conformance) ships test files;
// Next.js's build output is no test.
const NOT_TESTS = [...configDefaults.exclude, 'test/conformance/node_modules/**', 'test/runtimes/node_modules/**', 'test/nextjs/node_modules/**', 'test/node24/node_modules/**', 'test/nextjs/.next/**']
// Test files that judge their whole process, or mock a module: each runs in a process of its
// own (the projects below).
const ISOLATED = [
  // Heap, timers, sockets, listeners, warnings, what the process logs; Redis and PostgreSQL
  // servers started and stopped.
  'test/robustness/**/*.test.ts',
  'test/stores/**/*.test.ts',
  // process.on('unhandledRejection' | 'uncaughtException' | 'warning'), active timers, heap.
  'src/timeout.test.ts',
  'src/tokens/invalidation-resend.test.ts',
  'test/adapters/express.test.ts',
  'test/adapters/held-head.test.ts',
  'test/adapters/proxy.test.ts',
  // The global Response as the runtime has it: no server of another file replaced it.
  'test/adapters/web-runtime-response.test.ts',
  'test/oauth/oauth-validator.test.ts',
  'test/pipeline/observability-audit.test.ts',
  // What the process logs (console.error), counted exactly across awaits: a timer a file run
  // before them left behind could print into it.
  'test/adapters/fastify.test.ts',
  'test/adapters/on-error-default.test.ts',
  'test/adapters/token-api-node.test.ts',
  'test/pipeline/options.test.ts',
  'test/pipeline/rate-limit-audit.test.ts',
  'test/platform/forwarder.test.ts',
]

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
    // Builds dist/ when it is missing (a clean clone): the package suites check what is published.
    globalSetup: ['test/global-setup.ts'],
    testTimeout: 30_000,
    hookTimeout: 30_000,
    pool: 'forks',
    // One test file more than the cores, three at least: most files wait on sockets, timers and
    // child processes more than they compute. On a 2-core machine the suite took 441 s with one
    // file at a time, 390 s with two and 316 s with three (2026-12-04), which keeps CI within its
    // 15 minutes with room to spare. Files share no state but the services, under random Redis
    // key prefixes and PostgreSQL schemas, and ports of their own (test/helpers/redis.ts,
    // postgres.ts, the cluster tests).
    maxWorkers: Math.max(3, availableParallelism() + 1),
    // Most files share their worker process, and its modules, with the files it ran before
    // (isolate: false): each no longer imports vitest, the frameworks, the MCP SDK and the
    // package afresh in a process of its own, which took 207 s of the suite's CPU (72 s shared).
    // On 2 cores the suite went from 460 s to 367 and 380 s, the Node 24 leg from 141 s to
    // 84 s (2026-12-06). Each stops everything it starts, as every network test must. The
    // ISOLATED files run each in a process of its own, as before: they mock a module
    // (vi.mock), or judge the whole process (its heap, timers, listeners, warnings, unhandled
    // rejections, what it logs), which a file run before them in the same process could move.
    projects: [
      { extends: true, test: { name: 'isolated', include: ISOLATED, exclude: NOT_TESTS, isolate: true } },
      { extends: true, test: { name: 'shared', include: TEST_FILES, exclude: [...NOT_TESTS, ...ISOLATED], isolate: false } },
    ],
  },
})
