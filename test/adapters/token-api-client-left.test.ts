/**
 * A secret whose caller left before it was stored reaches nobody (found by an audit of client
 * retries, each failing on the old code): a Bearer rotation whose client gave up (its own
 * timeout, a proxy's 504 that closes the connection) landed all the same, and the client, holding
 * only the old secret, was told 401 `invalid_token` when it retried: locked out of an active
 * token nobody held. A creation whose dashboard request was abandoned left an active token
 * nobody held, counted against the user's limit. Now the rotation is undone and the token
 * revoked, as when the caller was answered 503. Express's `serveTokenApi`, real sockets on
 * 127.0.0.1, a store whose write (or an App lookup after it) is under way when the client leaves,
 * and lands once the server has seen it leave. Each step waits for the one before (no fixed
 * wait: on a loaded host, 150 ms for the client to leave and 700 ms for a write and its undo of
 * 300 ms each left the outcome to the scheduler).
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

const cleanups: Array<() => Promise<unknown> | void> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

/**
 * The token API on Express (or Fastify, or the Web adapter's runtime, @hono/node-server: `web`), over a
 * memory store whose first `slow` write is held; `getApp`: the App store's first lookup after a
 * rotation landed is (one that names the rotated token's Apps). The held step tells it began
 * (`begun`), then lands once the signal the token API gave the service call has aborted: the
 * client left while it ran, and the server has seen it leave. `settled` waits for the service
 * calls that hand out a secret to settle (one whose caller left rejects once the token was put
 * right).
 */
async function serve(slow: 'rotate' | 'insert' | 'getApp', on: 'express' | 'fastify' | 'web' = 'express') {
  let signal: AbortSignal | undefined
  let held = false
  let begin!: () => void
  const begun = new Promise<void>((resolve) => (begin = resolve))
  /** The held step, once: it lands once the caller's signal has aborted. */
  const hold = async () => {
    if (held) return
    held = true
    const caller = signal
    if (caller === undefined) throw new Error('the token API gave the service call no signal')
    begin()
    if (!caller.aborted) await new Promise((resolve) => caller.addEventListener('abort', resolve, { once: true }))
  }
  const inner = createMemoryTokenStore()
  let rotated = false
  const store: TokenStore =
    slow === 'getApp'
      ? { ...inner, rotate: async (...args) => ((rotated = true), inner.rotate(...args)) }
      : {
          ...inner,
          [slow]: async (...args: unknown[]) => {
            await hold()
            return (inner[slow] as (...a: unknown[]) => unknown)(...args)
          },
        }
  const appStore = createMemoryAppStore([{ id: 'app_1', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
  const apps: typeof appStore =
    slow === 'getApp'
      ? {
          ...appStore,
          getApp: async (id) => {
            if (rotated) await hold()
            return appStore.getApp(id)
          },
        }
      : appStore
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_1', active: true }])
  const errors: unknown[] = []
  const tokens = createTokenService({ store, apps, subscriptions, onError: (error) => void errors.push(error) })
  const calls: Array<Promise<unknown>> = []
  const handOut = <T>(call: { signal?: AbortSignal | undefined } | undefined, made: () => Promise<T>): Promise<T> => {
    signal = call?.signal
    const answer = made()
    calls.push(answer.catch(() => {}))
    return answer
  }
  const settled = async () => void (await Promise.all(calls))
  const api = createTokenApi({
    tokens: {
      ...tokens,
      rotate: (id, caller, call) => handOut(call, () => tokens.rotate(id, caller, call)),
      create: (input, call) => handOut(call, () => tokens.create(input, call)),
    },
    authenticateSession: (request) => (request.headers.get('cookie') === 'dash=alice' ? { userId: 'alice' } : null),
    verifyCsrf: (request) => request.headers.get('x-csrf-token') === 'csrf',
  })
  if (on === 'fastify') {
    const app = Fastify({ forceCloseConnections: true })
    await app.register(serveTokenApiOnFastify(api))
    await app.listen({ port: 0, host: '127.0.0.1' })
    cleanups.push(() => tokens.close(), () => app.close())
    return { port: (app.server.address() as AddressInfo).port, tokens, errors, begun, settled }
  }
  if (on === 'web') {
    const served = await serveFetch(async (request) => (await api(request)) ?? new Response(null, { status: 404 }))
    cleanups.push(() => tokens.close(), () => served.close())
    return { port: served.port, tokens, errors, begun, settled }
  }
  const app = express()
  app.use(serveTokenApi(api))
  const server = http.createServer(app)
  const port = await listen(server)
  cleanups.push(() => tokens.close(), () => close(server))
  return { port, tokens, errors, begun, settled }
}

/** A POST whose client gives up once `leaveWhen` settles (then `'left'`), or its answer. */
function post(port: number, path: string, headers: http.OutgoingHttpHeaders, body = '', leaveWhen?: Promise<unknown>) {
  return new Promise<{ status: number; body: string } | 'left'>((resolve, reject) => {
    const request = http.request(
      { host: '127.0.0.1', port, method: 'POST', path, agent: false, headers: { host: 'dash.localhost', 'content-length': Buffer.byteLength(body), ...headers } },
      (response) => {
        let text = ''
        response.on('data', (chunk: Buffer) => (text += chunk))
        response.on('end', () => resolve({ status: response.statusCode!, body: text }))
      },
    )
    request.on('error', (error) => (leaveWhen !== undefined ? resolve('left') : reject(error)))
    void leaveWhen?.then(() => request.destroy())
    request.end(body)
  })
}

/**
 * A Bearer rotation whose client leaves once the held call has begun: once the service has
 * settled, the rotation was undone (the old secret still works), and the client, sending it
 * again with that secret, gets a new one that works where the old no longer does.
 */
async function leaveRotationThenRetry({ port, tokens, begun, settled }: Awaited<ReturnType<typeof serve>>): Promise<void> {
  const created = await tokens.create({ userId: 'alice', name: 'CI', servers: ['app_1'], expiresInDays: 30 })
  const path = `/api/tokens/${created.id}/rotate`
  expect(await post(port, path, { authorization: `Bearer ${created.token}` }, '', begun)).toBe('left')
  // The rotation lands meanwhile, and is undone.
  await settled()
  expect((await tokens.authenticate(created.token)).ok).toBe(true)
  const retried = await post(port, path, { authorization: `Bearer ${created.token}` })
  expect(retried !== 'left' && retried.status).toBe(200)
  const secret = JSON.parse((retried as { body: string }).body).token as string
  expect((await tokens.authenticate(secret)).ok).toBe(true)
  expect((await tokens.authenticate(created.token)).ok).toBe(false)
}

describe('the token API, a caller that left before its secret was stored', () => {
  it('a Bearer rotation is undone: the client retries with the secret it holds, and gets a new one', async () => {
    const served = await serve('rotate')
    await leaveRotationThenRetry(served)
    expect(served.errors).toEqual([])
  })

  for (const on of ['express', 'fastify', 'web'] as const) {
    it(`a rotation whose client leaves once it landed, while the App store names the token's Apps, is undone too (${on}; regression: it stood, and the retry was 401 invalid_token)`, async () => {
      const served = await serve('getApp', on)
      await leaveRotationThenRetry(served)
      expect(served.errors).toEqual([])
    })
  }

  it('a rotation by the dashboard is undone too', async () => {
    const { port, tokens, begun, settled } = await serve('rotate')
    const created = await tokens.create({ userId: 'alice', name: 'CI', servers: ['app_1'], expiresInDays: 30 })
    expect(await post(port, `/api/tokens/${created.id}/rotate`, { cookie: 'dash=alice', 'x-csrf-token': 'csrf' }, '', begun)).toBe('left')
    await settled()
    expect((await tokens.authenticate(created.token)).ok).toBe(true)
  })

  it('a creation is revoked: the retry leaves one active token, the one whose secret the client holds', async () => {
    const { port, tokens, begun, settled } = await serve('insert')
    const headers = { cookie: 'dash=alice', 'x-csrf-token': 'csrf', 'content-type': 'application/json' }
    const body = JSON.stringify({ name: 'CI', servers: ['app_1'], expires_in_days: 30 })
    expect(await post(port, '/api/tokens', headers, body, begun)).toBe('left')
    await settled()
    const retried = await post(port, '/api/tokens', headers, body)
    expect(retried !== 'left' && retried.status).toBe(201)
    const active = (await tokens.list('alice')).filter((token) => token.status === 'active')
    expect(active.map((token) => token.id)).toEqual([JSON.parse((retried as { body: string }).body).id])
  })
})
