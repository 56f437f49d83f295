/**
 * A secret whose caller left before it was stored reaches nobody (found by an audit of client
 * retries, each failing on the old code): a Bearer rotation whose client gave up (its own
 * timeout, a proxy's 504 that closes the connection) landed all the same, and the client, holding
 * only the old secret, was told 401 `invalid_token` when it retried: locked out of an active
 * token nobody held. A creation whose dashboard request was abandoned left an active token
 * nobody held, counted against the user's limit. Now the rotation is undone and the token
 * revoked, as when the caller was answered 503. Express's `serveTokenApi`, real sockets on
 * 127.0.0.1, a store that takes 300 ms to write.
 */
import * as http from 'node:http'
import {
  type TokenStore,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenApi,
  createTokenService,
} from 'mcp-dispatch'
import type { AddressInfo } from 'node:net'
import { serveTokenApi } from 'mcp-dispatch/express'
import { serveTokenApi as serveTokenApiOnFastify } from 'mcp-dispatch/fastify'
import Fastify from 'fastify'
import express from 'express'
import { afterEach, describe, expect, it } from 'vitest'
import { close, listen } from './helpers.js'
import { serveFetch } from '../helpers/platform.js'

const WRITE_MS = 300
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const cleanups: Array<() => Promise<unknown> | void> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

/**
 * The token API on Express (or Fastify, or the Web adapter's runtime, @hono/node-server: `web`), over a
 * memory store whose `slow` write takes WRITE_MS; `getApp`: the App store's lookups take it
 * once a token exists (those that name a rotated token's Apps, after its write).
 */
async function serve(slow: 'rotate' | 'insert' | 'getApp', on: 'express' | 'fastify' | 'web' = 'express') {
  const inner = createMemoryTokenStore()
  const store: TokenStore =
    slow === 'getApp'
      ? inner
      : {
          ...inner,
          [slow]: async (...args: unknown[]) => {
            await sleep(WRITE_MS)
            return (inner[slow] as (...a: unknown[]) => unknown)(...args)
          },
        }
  const appStore = createMemoryAppStore([{ id: 'app_1', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
  const apps: typeof appStore =
    slow === 'getApp'
      ? {
          ...appStore,
          getApp: async (id) => {
            if ((await inner.listByUser('alice')).length > 0) await sleep(WRITE_MS)
            return appStore.getApp(id)
          },
        }
      : appStore
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_1', active: true }])
  const errors: unknown[] = []
  const tokens = createTokenService({ store, apps, subscriptions, onError: (error) => void errors.push(error) })
  const api = createTokenApi({
    tokens,
    authenticateSession: (request) => (request.headers.get('cookie') === 'dash=alice' ? { userId: 'alice' } : null),
    verifyCsrf: (request) => request.headers.get('x-csrf-token') === 'csrf',
  })
  if (on === 'fastify') {
    const app = Fastify({ forceCloseConnections: true })
    await app.register(serveTokenApiOnFastify(api))
    await app.listen({ port: 0, host: '127.0.0.1' })
    cleanups.push(() => tokens.close(), () => app.close())
    return { port: (app.server.address() as AddressInfo).port, tokens, errors }
  }
  if (on === 'web') {
    const served = await serveFetch(async (request) => (await api(request)) ?? new Response(null, { status: 404 }))
    cleanups.push(() => tokens.close(), () => served.close())
    return { port: served.port, tokens, errors }
  }
  const app = express()
  app.use(serveTokenApi(api))
  const server = http.createServer(app)
  const port = await listen(server)
  cleanups.push(() => tokens.close(), () => close(server))
  return { port, tokens, errors }
}

/** A POST whose client gives up after `leaveAfterMs` (then `'left'`), or its answer. */
function post(port: number, path: string, headers: http.OutgoingHttpHeaders, body = '', leaveAfterMs?: number) {
  return new Promise<{ status: number; body: string } | 'left'>((resolve, reject) => {
    const request = http.request(
      { host: '127.0.0.1', port, method: 'POST', path, agent: false, headers: { host: 'dash.localhost', 'content-length': Buffer.byteLength(body), ...headers } },
      (response) => {
        let text = ''
        response.on('data', (chunk: Buffer) => (text += chunk))
        response.on('end', () => resolve({ status: response.statusCode!, body: text }))
      },
    )
    request.on('error', (error) => (leaveAfterMs !== undefined ? resolve('left') : reject(error)))
    if (leaveAfterMs !== undefined) setTimeout(() => request.destroy(), leaveAfterMs)
    request.end(body)
  })
}

describe('the token API, a caller that left before its secret was stored', () => {
  it('a Bearer rotation is undone: the client retries with the secret it holds, and gets a new one', async () => {
    const { port, tokens, errors } = await serve('rotate')
    const created = await tokens.create({ userId: 'alice', name: 'CI', servers: ['app_1'], expiresInDays: 30 })
    const path = `/api/tokens/${created.id}/rotate`
    expect(await post(port, path, { authorization: `Bearer ${created.token}` }, '', WRITE_MS / 2)).toBe('left')
    // The rotation lands meanwhile, and is undone.
    await sleep(WRITE_MS * 2 + 100)
    expect((await tokens.authenticate(created.token)).ok).toBe(true)
    const retried = await post(port, path, { authorization: `Bearer ${created.token}` })
    expect(retried !== 'left' && retried.status).toBe(200)
    const secret = JSON.parse((retried as { body: string }).body).token as string
    expect((await tokens.authenticate(secret)).ok).toBe(true)
    expect((await tokens.authenticate(created.token)).ok).toBe(false)
    expect(errors).toEqual([])
  })

  for (const on of ['express', 'fastify', 'web'] as const) {
    it(`a rotation whose client leaves once it landed, while the App store names the token's Apps, is undone too (${on}; regression: it stood, and the retry was 401 invalid_token)`, async () => {
      const { port, tokens, errors } = await serve('getApp', on)
      const created = await tokens.create({ userId: 'alice', name: 'CI', servers: ['app_1'], expiresInDays: 30 })
      const path = `/api/tokens/${created.id}/rotate`
      expect(await post(port, path, { authorization: `Bearer ${created.token}` }, '', WRITE_MS / 2)).toBe('left')
      await sleep(WRITE_MS + 100)
      expect((await tokens.authenticate(created.token)).ok).toBe(true)
      const retried = await post(port, path, { authorization: `Bearer ${created.token}` })
      expect(retried !== 'left' && retried.status).toBe(200)
      expect(errors).toEqual([])
    })
  }

  it('a rotation by the dashboard is undone too', async () => {
    const { port, tokens } = await serve('rotate')
    const created = await tokens.create({ userId: 'alice', name: 'CI', servers: ['app_1'], expiresInDays: 30 })
    expect(await post(port, `/api/tokens/${created.id}/rotate`, { cookie: 'dash=alice', 'x-csrf-token': 'csrf' }, '', WRITE_MS / 2)).toBe('left')
    await sleep(WRITE_MS * 2 + 100)
    expect((await tokens.authenticate(created.token)).ok).toBe(true)
  })

  it('a creation is revoked: the retry leaves one active token, the one whose secret the client holds', async () => {
    const { port, tokens } = await serve('insert')
    const headers = { cookie: 'dash=alice', 'x-csrf-token': 'csrf', 'content-type': 'application/json' }
    const body = JSON.stringify({ name: 'CI', servers: ['app_1'], expires_in_days: 30 })
    expect(await post(port, '/api/tokens', headers, body, WRITE_MS / 2)).toBe('left')
    await sleep(WRITE_MS * 2 + 100)
    const retried = await post(port, '/api/tokens', headers, body)
    expect(retried !== 'left' && retried.status).toBe(201)
    const active = (await tokens.list('alice')).filter((token) => token.status === 'active')
    expect(active.map((token) => token.id)).toEqual([JSON.parse((retried as { body: string }).body).id])
  })
})
