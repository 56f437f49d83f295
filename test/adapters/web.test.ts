/**
 * The Web adapter (`mcp-dispatch/web`) against the shared suite: in memory with `Request`
 * objects, over loopback HTTP (`@hono/node-server`) for streaming.
 */
import { getDispatchContext, mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { serveFetch } from '../helpers/platform.js'
import { HOST, createFixture, rawRequest } from './helpers.js'
import { describeAdapter } from './suite.js'
import { startWeb, startWebOnNode } from './targets.js'

describeAdapter('web', startWeb)
// On @hono/node-server with `info.outgoing`: the headers go into Node's response head.
describeAdapter('web-node-head', startWebOnNode)

describe('web adapter specifics', () => {
  it('getDispatchContext finds the context of a dispatched request, and throws for another', async () => {
    const fixture = createFixture()
    let seen: string | undefined
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: (request) => {
        seen = getDispatchContext(request).version
        return new Response('ok')
      },
    })
    const res = await handle(
      new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' }),
    )
    expect(res.status).toBe(200)
    expect(seen).toBe('1.0.0')
    expect(() => getDispatchContext(new Request('http://weather.localhost/'))).toThrow(TypeError)
  })

  describe('info.outgoing (@hono/node-server)', () => {
    const probe = async (outgoing: (env: unknown) => unknown) => {
      const fixture = createFixture()
      const returned: Response[] = []
      const handle = mcpDispatch({
        dispatcher: fixture.dispatcher,
        handler: () => new Response('{"ok":true}', { headers: { 'content-type': 'application/json', 'mcp-session-id': 's-1' } }),
      })
      const served = await serveFetch(async (request, info) => {
        const response = await handle(request, { clientAddress: info.clientAddress, outgoing: outgoing(info.outgoing) })
        returned.push(response)
        return response
      })
      try {
        const res = await rawRequest(served.port, {
          path: '/v1',
          headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' },
          body: '{}',
        })
        // The session the handler opened is pinned either way.
        const next = await rawRequest(served.port, {
          path: '/',
          headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'mcp-session-id': 's-1', 'content-type': 'application/json' },
          body: '{}',
        })
        return { res, next, returned: returned[0]! }
      } finally {
        await served.close()
      }
    }

    it('puts the dispatch headers into the Node head and returns the handler response untouched', async () => {
      const { res, next, returned } = await probe((outgoing) => outgoing)
      expect(res.status).toBe(200)
      expect(res.headers['x-mcp-version']).toBe('1.0.0')
      expect(res.headers['x-mcp-latest-version']).toBeDefined()
      expect(returned.headers.get('x-mcp-version')).toBeNull()
      expect(next.status).toBe(200)
      expect(next.headers['x-mcp-version']).toBe('1.0.0')
    })

    it('a handler that throws or rejects gets the 502, with the dispatch headers as on Express and Fastify, and the server serves on', async () => {
      const fixture = createFixture()
      const errors: unknown[] = []
      const handle = mcpDispatch({
        dispatcher: fixture.dispatcher,
        onError: (error) => errors.push(error),
        handler: (request) => {
          const how = request.headers.get('x-fail')
          if (how === 'throw') throw new Error('thrown')
          if (how === 'reject') return Promise.reject(new Error('rejected'))
          return new Response('{}', { headers: { 'content-type': 'application/json' } })
        },
      })
      const served = await serveFetch(handle)
      try {
        const send = (how?: string) =>
          rawRequest(served.port, {
            path: '/v1',
            headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', ...(how && { 'x-fail': how }) },
            body: '{}',
          })
        for (const how of ['throw', 'reject']) {
          const res = await send(how)
          expect(res.status).toBe(502)
          expect(res.headers['x-mcp-version']).toBe('1.0.0')
          expect(JSON.parse(res.body)).toMatchObject({ error: { data: { error: 'handler_error' } } })
        }
        expect(errors.map((e) => (e as Error).message)).toEqual(['thrown', 'rejected'])
        const ok = await send()
        expect(ok.status).toBe(200)
        expect(ok.headers['x-mcp-version']).toBe('1.0.0')
      } finally {
        await served.close()
      }
    })

    it('ignores an outgoing that is not a node:http response, and stamps the Response instead', async () => {
      const { res, next, returned } = await probe(() => ({ writeHead() {}, getHeader() {}, headersSent: false }))
      const { res: atHead } = await probe((outgoing) => outgoing)
      const { date: _d1, ...stamped } = res.headers
      const { date: _d2, ...headed } = atHead.headers
      expect(stamped).toEqual(headed)
      expect(res.headers['x-mcp-version']).toBe('1.0.0')
      expect(returned.headers.get('x-mcp-version')).toBe('1.0.0')
      expect(next.status).toBe(200)
    })
  })
})
