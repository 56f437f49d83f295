/**
 * The Web adapter (`mcp-dispatch/web`) against the shared suite: in memory with `Request`
 * objects, over loopback HTTP (`@hono/node-server`) for streaming.
 */
import { getDispatchContext, mcpDispatch, whenBodyEnds } from 'mcp-dispatch/web'
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

describe('whenBodyEnds', () => {
  const encoder = new TextEncoder()
  const streamOf = (chunks: string[], fail?: Error) =>
    new ReadableStream<Uint8Array>({
      start(controller) {
        for (const chunk of chunks) controller.enqueue(encoder.encode(chunk))
        if (fail) controller.error(fail)
        else controller.close()
      },
    })

  it('calls back once the body is read to the end, and passes status, headers and bytes through', async () => {
    let ended = 0
    const response = whenBodyEnds(new Response(streamOf(['a', 'b']), { status: 201, headers: { 'x-kept': 'yes' } }), () => ended++)
    expect(ended).toBe(0)
    expect(response.status).toBe(201)
    expect(response.headers.get('x-kept')).toBe('yes')
    expect(await response.text()).toBe('ab')
    expect(ended).toBe(1)
  })

  it('calls back once when the reader cancels, or the source fails; at once without a body', async () => {
    let cancelledSource = false
    const source = new ReadableStream<Uint8Array>({
      pull: (controller) => controller.enqueue(encoder.encode('tick')),
      cancel: () => void (cancelledSource = true),
    })
    let ended = 0
    const open = whenBodyEnds(new Response(source), () => ended++)
    const reader = open.body!.getReader()
    await reader.read()
    await reader.cancel('client gone')
    expect(cancelledSource).toBe(true)
    expect(ended).toBe(1)

    let failed = 0
    await expect(whenBodyEnds(new Response(streamOf(['x'], new Error('upstream broke'))), () => failed++).text()).rejects.toThrow('upstream broke')
    expect(failed).toBe(1)

    let empty = 0
    whenBodyEnds(new Response(null, { status: 204 }), () => empty++)
    expect(empty).toBe(1)
  })
})
