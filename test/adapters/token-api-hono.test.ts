/**
 * docs/api-tokens.md's sample for Hono (`serveTokenApiOnHono`), taken from the page and run as
 * printed on `@hono/node-server`, in front of the Web adapter: the token API answers its own
 * paths with the socket's address as the client address (a token's allowlist holds there), and
 * every other request goes on to the Apps.
 */
import * as http from 'node:http'
import { getRequestListener } from '@hono/node-server'
import { getConnInfo } from '@hono/node-server/conninfo'
import { Hono } from 'hono'
import { type TokenApi, type TokenService, createTokenApi } from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { close, createFixture, listen, loopbackFetch } from './helpers.js'
import { importBlock } from '../helpers/docs-samples.js'

interface HonoSample {
  serveTokenApiOnHono(app: Hono, api: TokenApi): void
}

describe('docs/api-tokens.md: the token API on Hono, as printed', () => {
  it('rotates a token with itself as Bearer (its allowlist read against the socket\'s address), answers its other paths itself, and passes every other request on to the Apps', async () => {
    const { serveTokenApiOnHono } = await importBlock<HonoSample>('api-tokens-hono', 'docs/api-tokens.md', 'On Hono, ask it from a middleware', 'A Next.js route handler')
    const fixture = createFixture()
    const tokens = fixture.dispatcherOptions.tokens as TokenService
    const api = createTokenApi({ tokens, authenticateSession: () => null, verifyCsrf: () => true })
    const mcp = mcpDispatch({ dispatcher: fixture.dispatcher, onError: fixture.onError, handler: () => Response.json({ jsonrpc: '2.0', id: 1, result: { tools: [] } }) })
    const app = new Hono()
    serveTokenApiOnHono(app, api)
    app.all('*', (c) => mcp(c.req.raw, { clientAddress: getConnInfo(c).remote.address }))
    const server = http.createServer(getRequestListener(app.fetch))
    const port = await listen(server)
    const base = `http://127.0.0.1:${port}`
    const rotate = (id: string, secret: string, headers: Record<string, string> = {}) =>
      fetch(`${base}/api/tokens/${id}/rotate`, { method: 'POST', headers: { ...headers, authorization: `Bearer ${secret}` } })
    const toolsList = (secret: string) =>
      loopbackFetch(`http://weather.localhost:${port}/v1`, {
        method: 'POST',
        headers: { authorization: `Bearer ${secret}`, 'content-type': 'application/json' },
        body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
      })
    try {
      for (const allowedIps of [null, ['127.0.0.1']]) {
        const made = await tokens.create({ userId: 'alice', name: 'hono', servers: ['app_weather'], expiresInDays: 7, allowedIps })
        const rotated = await rotate(made.id, made.token)
        expect(rotated.status, `allowlist ${String(allowedIps)}`).toBe(200)
        const body = await rotated.json()
        expect(body).toMatchObject({ id: made.id, expires_at: made.expires_at, allowed_ips: allowedIps })
        expect(body.token).toMatch(/^svc_/)
        expect(body.token).not.toBe(made.token)
        // On to the Apps: the new secret is served, the old one is refused at once.
        const served = await toolsList(body.token)
        expect(served.status).toBe(200)
        expect(served.headers.get('x-mcp-version')).toBe('1.0.0')
        expect((await toolsList(made.token)).status).toBe(401)
      }
      // Out of its allowlist: the socket's address is what the API judged, never X-Forwarded-For.
      const elsewhere = await tokens.create({ userId: 'alice', name: 'hono', servers: ['app_weather'], expiresInDays: 7, allowedIps: ['10.0.0.0/8'] })
      const refused = await rotate(elsewhere.id, elsewhere.token, { 'x-forwarded-for': '10.1.2.3' })
      expect(refused.status).toBe(403)
      expect(await refused.json()).toMatchObject({ error: 'forbidden', message: expect.stringMatching(/allowlist|address/i) })
      // Its other paths are its own (no dashboard session: 401 in its format), not the Apps' JSON-RPC 404.
      const listed = await fetch(`${base}/api/tokens`)
      expect(listed.status).toBe(401)
      const unauthorized = await listed.json()
      expect(unauthorized).toMatchObject({ error: 'unauthorized' })
      expect(unauthorized.jsonrpc).toBeUndefined()
      expect(fixture.errors).toEqual([])
    } finally {
      await close(server)
    }
  })
})
