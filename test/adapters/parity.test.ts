/**
 * Rejections are byte for byte the same through the three adapters: the same raw HTTP
 * request, sent over loopback to Web (`@hono/node-server`), Express (5 and 4) and Fastify, gets the
 * same status, the same body bytes and the same header fields (all of them, except `Date`
 * and the connection management fields HTTP adds).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { ALLOWED_ORIGIN, type Fixture, type HttpRecord, type TestRequest, createFixture, createGate, rawRequest } from './helpers.js'
import { type AdapterTarget, busyRateLimited, expectReply, rejectionCases } from './suite.js'
import { startExpress, startExpress4, startFastify, startWeb } from './targets.js'

const NAMES = ['web', 'express', 'express4', 'fastify'] as const
const STARTS = { web: startWeb, express: startExpress, express4: startExpress4, fastify: startFastify }

/** Everything on the wire but the fields that differ by time or connection. */
function wire(record: HttpRecord): HttpRecord {
  const headers = Object.fromEntries(
    Object.entries(record.headers)
      .filter(([name]) => name !== 'date' && name !== 'connection' && name !== 'keep-alive')
      .sort(([a], [b]) => a.localeCompare(b)),
  )
  return { status: record.status, headers, body: record.body }
}

describe('rejections are byte for byte identical across the Web, Express (5 and 4) and Fastify adapters', () => {
  const running = new Map<(typeof NAMES)[number], { fixture: Fixture; target: AdapterTarget }>()

  beforeAll(async () => {
    for (const name of NAMES) {
      const fixture = createFixture()
      running.set(name, { fixture, target: await STARTS[name]({ fixture, probe: { gate: createGate() } }) })
    }
  })
  afterAll(async () => {
    for (const { target } of running.values()) await target.close()
  })

  /** Sends the request (built per adapter, since tokens differ per fixture) to all of them. */
  async function sendToAll(build: (fixture: Fixture) => TestRequest): Promise<Record<(typeof NAMES)[number], HttpRecord>> {
    const out = {} as Record<(typeof NAMES)[number], HttpRecord>
    for (const name of NAMES) {
      const { fixture, target } = running.get(name)!
      out[name] = wire(await rawRequest(target.port, build(fixture)))
    }
    return out
  }

  const names = rejectionCases(createFixture()).map((c) => c.name)
  for (const [i, name] of names.entries()) {
    it(name, async () => {
      const all = await sendToAll((fixture) => rejectionCases(fixture)[i]!.request)
      expect(all.express).toEqual(all.web)
      expect(all.express4).toEqual(all.web)
      expect(all.fastify).toEqual(all.web)
      expectReply(all.web, rejectionCases(createFixture())[i]!.reply)
      expect(all.web.headers['content-length']).toBe(String(Buffer.byteLength(all.web.body)))
    })
  }

  it('429 after the limit', async () => {
    const request = (fixture: Fixture): TestRequest => ({
      host: 'busy.localhost',
      path: '/',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${fixture.tokens.aliceBusy}` },
      body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
    })
    await sendToAll(request)
    const all = await sendToAll(request)
    expect(all.express).toEqual(all.web)
    expect(all.express4).toEqual(all.web)
    expect(all.fastify).toEqual(all.web)
    expectReply(all.web, busyRateLimited())
  })

  it('401 of a browser request, with its CORS headers', async () => {
    const all = await sendToAll(() => ({ path: '/v1', headers: { origin: ALLOWED_ORIGIN }, body: '{}' }))
    expect(all.express).toEqual(all.web)
    expect(all.express4).toEqual(all.web)
    expect(all.fastify).toEqual(all.web)
    expect(all.web.status).toBe(401)
    expect(all.web.headers['access-control-allow-origin']).toBe(ALLOWED_ORIGIN)
  })

  it('502 of a handler that set headers of its own (Content-Encoding, Mcp-Session-Id) and threw: none of them', async () => {
    const all = await sendToAll((fixture) => ({
      path: '/v1',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${fixture.tokens.alice}`, origin: ALLOWED_ORIGIN, 'x-test-throw': '1', 'x-test-session': 'never-pinned' },
      body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
    }))
    expect(all.express).toEqual(all.web)
    expect(all.express4).toEqual(all.web)
    expect(all.fastify).toEqual(all.web)
    expect(all.web.status).toBe(502)
    expect(all.web.headers['x-mcp-version']).toBe('1.0.0')
    expect(all.web.headers['access-control-allow-origin']).toBe(ALLOWED_ORIGIN)
    expect(all.web.headers['mcp-session-id']).toBeUndefined()
  })

  it('the protected-resource metadata and the CORS preflight', async () => {
    for (const request of [
      { method: 'GET', path: '/.well-known/oauth-protected-resource' },
      { method: 'OPTIONS', path: '/v1', headers: { origin: ALLOWED_ORIGIN, 'access-control-request-method': 'POST' } },
    ]) {
      const all = await sendToAll(() => request)
      expect(all.express).toEqual(all.web)
    expect(all.express4).toEqual(all.web)
      expect(all.express4).toEqual(all.web)
      expect(all.fastify).toEqual(all.web)
    }
  })
})
