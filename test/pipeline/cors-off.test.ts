/**
 * `cors: false`: the platform does CORS itself. The dispatcher then adds no `Access-Control-*`
 * header to any answer (the metadata document and preflights included), so the platform's own
 * layer, here Hono's `cors()` in front of the Web adapter, is the only one a browser reads.
 */
import { createDispatcher } from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { Hono } from 'hono'
import { cors } from 'hono/cors'
import { describe, expect, it } from 'vitest'
import { ALLOWED_ORIGIN, HOST, createFixture } from '../adapters/helpers.js'

const TOOLS = { jsonrpc: '2.0', id: 1, result: { tools: [] } }

function setup(corsOption: boolean, fixture = createFixture()) {
  const dispatch = mcpDispatch({
    dispatcher: createDispatcher({ ...fixture.dispatcherOptions, cors: corsOption }),
    handler: () => Response.json(TOOLS),
  })
  return { fixture, dispatch }
}

/** The requests a browser-based client makes, each with the allowed Origin. */
function browserRequests(token: string): Array<[string, Request]> {
  const origin = { origin: ALLOWED_ORIGIN }
  const preflight = { ...origin, 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization, content-type' }
  const post = (headers: Record<string, string>) =>
    new Request(`http://${HOST}/v1`, { method: 'POST', headers: { ...origin, 'content-type': 'application/json', ...headers }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }) })
  return [
    ['POST /v1 (200)', post({ authorization: `Bearer ${token}` })],
    ['POST /v1 without a credential (401)', post({})],
    ['GET metadata', new Request(`http://${HOST}/.well-known/oauth-protected-resource`, { headers: origin })],
    ['POST metadata (405)', new Request(`http://${HOST}/.well-known/oauth-protected-resource`, { method: 'POST', headers: origin })],
    ['preflight of /v1', new Request(`http://${HOST}/v1`, { method: 'OPTIONS', headers: preflight })],
    ['preflight of the metadata', new Request(`http://${HOST}/.well-known/oauth-protected-resource`, { method: 'OPTIONS', headers: preflight })],
    ['preflight of an unknown path', new Request(`http://${HOST}/nowhere`, { method: 'OPTIONS', headers: preflight })],
  ]
}

function corsHeaderNames(response: Response): string[] {
  return [...response.headers.keys()].filter((name) => name.startsWith('access-control-'))
}

describe('cors: false leaves CORS to the platform', () => {
  it('no answer carries an Access-Control header; an OPTIONS gets 204 with Allow alone; the rest is answered as with CORS on', async () => {
    const off = setup(false)
    const on = setup(true, off.fixture)
    for (const [what, request] of browserRequests(off.fixture.tokens.alice)) {
      const [withCors, without] = await Promise.all([on.dispatch(request.clone()), off.dispatch(request)])
      expect(corsHeaderNames(without), what).toEqual([])
      // The same request with CORS on gets them, so the line above means something.
      expect(corsHeaderNames(withCors).length, what).toBeGreaterThan(0)
      if (what.includes('unknown path')) {
        // With CORS on, the preflight succeeds so the browser can read the 404 that follows;
        // without, it is the 404 itself.
        expect([withCors.status, without.status], what).toEqual([204, 404])
        expect(JSON.parse(await without.text()), what).toMatchObject({ error: { data: { error: 'not_found' } } })
        continue
      }
      expect(without.status, what).toBe(withCors.status)
      expect(without.headers.get('allow'), what).toBe(withCors.headers.get('allow'))
      expect(without.headers.get('x-mcp-version'), what).toBe(withCors.headers.get('x-mcp-version'))
      expect(await without.text(), what).toBe(await withCors.text())
    }
    expect(off.fixture.errors).toEqual([])
  })

  it("allowedOrigins still refuses an Origin it does not allow (403), without CORS headers", async () => {
    const { fixture, dispatch } = setup(false)
    const response = await dispatch(
      new Request(`http://${HOST}/v1`, { method: 'POST', headers: { origin: 'https://evil.example', authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' }, body: '{}' }),
    )
    expect(response.status).toBe(403)
    expect(corsHeaderNames(response)).toEqual([])
  })

  it("behind Hono's cors(), every answer a browser reads carries that layer's CORS headers alone: its Access-Control-Allow-Origin, the MCP headers it exposes, its Vary", async () => {
    const { fixture, dispatch } = setup(false)
    const app = new Hono()
    app.use(
      '*',
      cors({
        origin: ALLOWED_ORIGIN,
        allowHeaders: ['authorization', 'content-type', 'mcp-session-id', 'mcp-protocol-version'],
        exposeHeaders: ['WWW-Authenticate', 'Mcp-Session-Id', 'X-MCP-Version', 'X-MCP-Latest-Version'],
      }),
    )
    app.all('*', (c) => dispatch(c.req.raw))
    for (const [what, request] of browserRequests(fixture.tokens.alice)) {
      const response = await app.fetch(request)
      expect(response.headers.get('access-control-allow-origin'), what).toBe(ALLOWED_ORIGIN)
      if (request.method === 'OPTIONS') {
        expect(response.status, what).toBe(204)
        expect(response.headers.get('access-control-allow-headers'), what).toBe('authorization,content-type,mcp-session-id,mcp-protocol-version')
      } else {
        expect(response.headers.get('access-control-expose-headers'), what).toBe('WWW-Authenticate,Mcp-Session-Id,X-MCP-Version,X-MCP-Latest-Version')
        // The layer's own Vary alone (with CORS on, the dispatcher's joined it: "Origin, Origin").
        expect(response.headers.get('vary'), what).toBe('Origin')
      }
    }
    const served = await app.fetch(browserRequests(fixture.tokens.alice)[0]![1])
    expect(served.status).toBe(200)
    expect(served.headers.get('x-mcp-version')).toBe('1.0.0')
    expect(await served.json()).toEqual(TOOLS)
  })
})
