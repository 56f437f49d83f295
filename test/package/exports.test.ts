/**
 * Imports the built package the way users do: ESM `import`, CJS `require`, by its public
 * name, from a separate Node process. Checks `dist/`, which test/global-setup.ts builds when it
 * is missing; after a change to `src/`, build again (`.ci/run` always does).
 */
import { execFileSync, spawnSync } from 'node:child_process'
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { isBuiltin } from 'node:module'
import { tmpdir } from 'node:os'
import { join, resolve } from 'node:path'
import { afterAll, describe, expect, it } from 'vitest'
import { underCI } from '../helpers/ci.js'

const root = resolve(import.meta.dirname, '../..')
const built = existsSync(join(root, 'dist/index.js'))
if (!built && underCI()) throw new Error('dist/ is missing: CI must run `npm run build` before the tests')
if (!built) console.warn('[exports.test] skipped: run `npm run build` first')

describe.runIf(built)('built package', () => {
  const dir = mkdtempSync(join(tmpdir(), 'mcp-dispatch-consumer-'))
  mkdirSync(join(dir, 'node_modules'))
  symlinkSync(root, join(dir, 'node_modules/mcp-dispatch'), 'dir')
  afterAll(() => rmSync(dir, { recursive: true, force: true }))

  const run = (file: string, source: string) => {
    writeFileSync(join(dir, file), source)
    return execFileSync(process.execPath, [join(dir, file)], { cwd: dir, encoding: 'utf8' }).trim()
  }

  it('imports the root and the web adapter as ESM', () => {
    const out = run(
      'esm.mjs',
      `import { parseVersionPath, generateApiToken, createDispatcher } from 'mcp-dispatch'
       import { mcpDispatch } from 'mcp-dispatch/web'
       console.log(JSON.stringify([parseVersionPath('/v1.2'), generateApiToken().length, typeof createDispatcher, typeof mcpDispatch]))`,
    )
    expect(JSON.parse(out)).toEqual([{ kind: 'minor', major: 1, minor: 2 }, 48, 'function', 'function'])
  })

  it('a handler failure on a request dispatched by the ESM build and routed by the CommonJS one (two copies of the package) is reported to the dispatching copy\'s onError, never swallowed, and a request meeting both copies\' middleware is decided once (regression: 502 and no report; Express: logged to stderr, and decided twice)', async () => {
    writeFileSync(
      join(dir, 'two-copies.mjs'),
      `import { createRequire } from 'node:module'
       import { createDispatcher, createMemoryAppStore, createMemoryTokenStore, createTokenService } from 'mcp-dispatch'
       import * as esmFastify from 'mcp-dispatch/fastify'
       import * as esmExpress from 'mcp-dispatch/express'
       const require = createRequire(import.meta.url)
       const cjsFastify = require('mcp-dispatch/fastify')
       const cjsExpress = require('mcp-dispatch/express')
       const fromRoot = createRequire(${JSON.stringify(join(root, 'package.json'))})
       const Fastify = fromRoot('fastify')
       const express = fromRoot('express')
       const apps = createMemoryAppStore([{ id: 'app_w', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
       const subscriptions = { isActive: () => true }
       const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
       const { token } = await tokens.create({ userId: 'u', name: 'n', servers: ['app_w'], expiresInDays: 7 })
       const dispatcher = createDispatcher({ apps, subscriptions, tokens, authorizationServers: ['https://auth.example.com'] })
       const reports = []
       const onError = (error, context) => reports.push([context, error.message])
       const boom = () => () => { throw new Error('boom') }
       const headers = { host: 'weather.localhost', authorization: 'Bearer ' + token, 'content-type': 'application/json', accept: 'application/json, text/event-stream' }
       const fastify = Fastify()
       await fastify.register(esmFastify.mcpDispatch({ dispatcher, onError }))
       fastify.post('/*', cjsFastify.routeByVersion(boom))
       const answered = await fastify.inject({ method: 'POST', url: '/v1', headers, payload: '{}' })
       await fastify.close()
       const app = express()
       app.use(esmExpress.mcpDispatch({ dispatcher, onError }))
       app.use(cjsExpress.routeByVersion(boom))
       const server = app.listen(0, '127.0.0.1')
       await new Promise((resolve) => server.once('listening', resolve))
       const { request } = await import('node:http')
       const expressAnswer = await new Promise((resolve, reject) => {
         const sent = request({ host: '127.0.0.1', port: server.address().port, path: '/v1', method: 'POST', headers, agent: false }, (res) => { res.resume(); res.on('end', () => resolve({ status: res.statusCode })) })
         sent.on('error', reject)
         sent.end('{}')
       })
       server.close()
       // Both copies' middleware on one request (a sub-app of the other build): decided once,
       // so its one request a minute is served, and the other copy reads its context.
       const once = createDispatcher({ apps, subscriptions, tokens, rateLimit: { policy: () => ({ limit: 1, windowType: 'minute' }) } })
       const twice = express()
       twice.use(esmExpress.mcpDispatch({ dispatcher: once, onError }))
       twice.use(cjsExpress.mcpDispatch({ dispatcher: once, onError }))
       twice.use((req, res) => res.json({ version: cjsExpress.getDispatchContext(req).version }))
       const server2 = twice.listen(0, '127.0.0.1')
       await new Promise((resolve) => server2.once('listening', resolve))
       const twiceAnswer = await new Promise((resolve, reject) => {
         const sent = request({ host: '127.0.0.1', port: server2.address().port, path: '/v1', method: 'POST', headers, agent: false }, (res) => { let body = ''; res.on('data', (c) => (body += c)); res.on('end', () => resolve({ status: res.statusCode, body })) })
         sent.on('error', reject)
         sent.end('{}')
       })
       server2.close()
       await tokens.close()
       console.log(JSON.stringify({ fastify: answered.statusCode, express: expressAnswer.status, twice: twiceAnswer, reports }))`,
    )
    const result = spawnSync(process.execPath, [join(dir, 'two-copies.mjs')], { cwd: dir, encoding: 'utf8' })
    expect(result.status, result.stderr).toBe(0)
    // Fastify: the request's reporter is found under a registered symbol; Express: in the map of
    // dispatched requests every copy shares. Both the ESM copy's onError, nothing on stderr.
    expect(JSON.parse(result.stdout)).toEqual({
      fastify: 502,
      express: 502,
      twice: { status: 200, body: '{"version":"1.0.0"}' },
      reports: [
        ['handler', 'boom'],
        ['handler', 'boom'],
      ],
    })
    expect(result.stderr).not.toContain('[mcp-dispatch]')
  })

  it('requires the root and the web adapter as CommonJS', () => {
    const out = run(
      'cjs.cjs',
      `const { parseApiToken, generateApiToken } = require('mcp-dispatch')
       const { mcpDispatch } = require('mcp-dispatch/web')
       const t = generateApiToken()
       console.log(JSON.stringify([parseApiToken(t).displayPrefix === t.slice(0, 12), typeof mcpDispatch]))`,
    )
    expect(JSON.parse(out)).toEqual([true, 'function'])
  })

  // tsup strips `node:` by default (`removeNodeProtocol`): a bare `crypto` is a package to a bundler
  // for Workers (esbuild: "Could not resolve"), where `node:crypto` is left to the runtime.
  it('names Node\'s built-ins with the node: prefix in every built file', () => {
    const bare: string[] = []
    for (const file of readdirSync(join(root, 'dist'), { recursive: true, encoding: 'utf8' })) {
      if (!/\.c?js$/.test(file)) continue
      const code = readFileSync(join(root, 'dist', file), 'utf8')
      for (const [, name] of code.matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|\brequire\s*\(\s*)['"]([^'"]+)['"]/g)) {
        if (isBuiltin(name!) && !name!.startsWith('node:')) bare.push(`${file}: ${name}`)
      }
    }
    expect(bare).toEqual([])
  })

  it('ends every built file with one sourceMappingURL comment, naming a map that is there (regression: two, from tsup\'s treeshake pass)', () => {
    const wrong: string[] = []
    for (const file of readdirSync(join(root, 'dist'), { recursive: true, encoding: 'utf8' })) {
      if (!/\.c?js$/.test(file)) continue
      const comments = [...readFileSync(join(root, 'dist', file), 'utf8').matchAll(/^\/\/# sourceMappingURL=(.*)$/gm)]
      if (comments.length !== 1 || !existsSync(join(root, 'dist', file, '..', comments[0]![1]!))) wrong.push(`${file}: ${comments.length}`)
    }
    expect(wrong).toEqual([])
  })

  /** The packages (bare specifiers, builtins aside) that importing `specifier` loads, in a child process. */
  const packagesImportedBy = (specifier: string) => {
    // A resolve hook records every bare specifier the import pulls in.
    writeFileSync(
      join(dir, 'hooks.mjs'),
      `export async function resolve(specifier, context, next) {
         if (!specifier.startsWith('.') && !specifier.startsWith('node:') && !specifier.startsWith('file:')) process.stderr.write('SPEC ' + specifier + '\\n')
         return next(specifier, context)
       }`,
    )
    writeFileSync(join(dir, 'register.mjs'), `import { register } from 'node:module'; register('./hooks.mjs', import.meta.url)`)
    writeFileSync(join(dir, 'graph.mjs'), `await import(${JSON.stringify(specifier)})`)
    const result = spawnSync(process.execPath, ['--import', './register.mjs', 'graph.mjs'], { cwd: dir, encoding: 'utf8' })
    expect(result.status).toBe(0)
    const specifiers = [...result.stderr.matchAll(/^SPEC (\S+)$/gm)].map((m) => m[1])
    expect(specifiers).toContain(specifier)
    const bare = new Set(specifiers.map((s) => s!.split('/')[0]!.startsWith('@') ? s!.split('/').slice(0, 2).join('/') : s!.split('/')[0]))
    bare.delete('mcp-dispatch')
    for (const name of bare) if (isBuiltin(name!)) bare.delete(name)
    return bare
  }

  it('keeps the root entry free of adapters and database clients', () => {
    for (const name of packagesImportedBy('mcp-dispatch')) expect(['jose', 'lru-cache', 'semver', 'zod']).toContain(name)
  })

  it('loads mcp-dispatch/redis (ESM and CommonJS) without importing a Redis client', () => {
    for (const name of packagesImportedBy('mcp-dispatch/redis')) expect(['jose', 'lru-cache', 'semver', 'zod']).toContain(name)
    const out = run(
      'redis.cjs',
      `const { createRedisSessionStore, createRedisInvalidationBus } = require('mcp-dispatch/redis')
       console.log(JSON.stringify([typeof createRedisSessionStore({ client: { call: async () => null } }).get, typeof createRedisInvalidationBus]))`,
    )
    expect(JSON.parse(out)).toEqual(['function', 'function'])
  })

  it('loads mcp-dispatch/postgres as ESM and CommonJS without importing pg', () => {
    for (const name of packagesImportedBy('mcp-dispatch/postgres')) expect(['jose', 'lru-cache', 'semver', 'zod']).toContain(name)
    const esm = run(
      'postgres.mjs',
      `import { createPostgresTokenStore, postgresTokenStoreMigration } from 'mcp-dispatch/postgres'
       console.log(JSON.stringify([typeof createPostgresTokenStore, postgresTokenStoreMigration().includes('CREATE TABLE IF NOT EXISTS')]))`,
    )
    expect(JSON.parse(esm)).toEqual(['function', true])
    const cjs = run(
      'postgres.cjs',
      `const { createPostgresTokenStore } = require('mcp-dispatch/postgres')
       const store = createPostgresTokenStore({ pool: { query: async () => ({ rows: [] }) } })
       console.log(JSON.stringify([store.table, typeof store.findByHash]))`,
    )
    expect(JSON.parse(cjs)).toEqual(['"public"."mcp_dispatch_api_tokens"', 'function'])
  })
})
