/**
 * A handler that assigns a session id a live pin already holds (a bug, or an App behind the
 * proxy that chooses its own ids) must not move that session: spec 9.2.1, the version is fixed
 * for the whole connection, and the pin binds its owner. The existing pin is kept, the new
 * session gets none (its next request is 404 `session_not_found`), and `onError` says why.
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import express from 'express'
import Fastify from 'fastify'
import { type SessionStore, createDispatcher, createMemorySessionStore } from 'mcp-dispatch'
import * as expressAdapter from 'mcp-dispatch/express'
import * as fastifyAdapter from 'mcp-dispatch/fastify'
import { mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { close, createFixture, listen, rawRequest } from '../adapters/helpers.js'

describe('a session id assigned twice', () => {
  function serve() {
    const fixture = createFixture()
    let assign = ''
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: (request, context) => {
        const headers: Record<string, string> = { 'content-type': 'application/json' }
        // A request without a session is an initialize: the handler assigns the id set for it.
        if (!request.headers.get('mcp-session-id')) headers['mcp-session-id'] = assign
        return new Response(JSON.stringify({ jsonrpc: '2.0', id: 1, result: { version: context.version, app: context.app.id } }), { headers })
      },
    })
    const call = async (host: string, path: string, token: string, sessionId?: string) => {
      const response = await handle(
        new Request(`http://${host}${path}`, {
          method: 'POST',
          headers: {
            authorization: `Bearer ${token}`,
            'content-type': 'application/json',
            ...(sessionId && { 'mcp-session-id': sessionId }),
          },
          body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
        }),
        { clientAddress: '127.0.0.1' },
      )
      return { status: response.status, version: response.headers.get('x-mcp-version'), body: await response.json() }
    }
    return { fixture, call, assign: (id: string) => (assign = id) }
  }

  it('by another App to another user: the first session keeps its App, version and owner; the second gets no pin', async () => {
    const { fixture, call, assign } = serve()
    assign('shared-id')
    expect((await call('weather.localhost', '/v1', fixture.tokens.alice)).version).toBe('1.0.0')
    expect((await call('notes.localhost', '/', fixture.tokens.carol)).status).toBe(200)
    expect(fixture.errors.map((e) => String(e.error))).toEqual([expect.stringContaining('already pinned to a live session')])
    expect(await call('weather.localhost', '/v1', fixture.tokens.alice, 'shared-id')).toMatchObject({ status: 200, version: '1.0.0' })
    expect(await call('notes.localhost', '/', fixture.tokens.carol, 'shared-id')).toMatchObject({
      status: 404,
      body: { error: { data: { error: 'session_not_found' } } },
    })
  })

  it('a store answering its set as Redis does (null for SET NX on a key already there, 0 for SETNX) is read as taken: the report is the same', async () => {
    for (const taken of [null, 0]) {
      const memory = createMemorySessionStore()
      // A store of the platform's own over raw SET NX: 'OK' when stored, null (or 0) when not.
      const sessions: SessionStore = { ...memory, synchronous: true, set: (id, pin, ttl) => (memory.set(id, pin, ttl) === false ? taken : 'OK') as never }
      const fixture = createFixture()
      const handle = mcpDispatch({
        dispatcher: createDispatcher({ ...fixture.dispatcherOptions, sessions }),
        handler: () => new Response('{"jsonrpc":"2.0","id":1,"result":{}}', { headers: { 'content-type': 'application/json', 'mcp-session-id': 'shared-id' } }),
      })
      for (const [host, token] of [['weather.localhost', fixture.tokens.alice], ['notes.localhost', fixture.tokens.carol]] as const) {
        const response = await handle(new Request(`http://${host}/`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: '{}' }), { clientAddress: '127.0.0.1' })
        expect(response.status).toBe(200)
      }
      // Before: taken for stored, unreported, and the new session's stream kept the other's pin.
      expect(fixture.errors.map((e) => String(e.error)), String(taken)).toEqual([expect.stringContaining('already pinned to a live session')])
    }
  })

  it("a session's id sent by its owner to another App is 404 session_not_found there: the pin binds the App", async () => {
    const { fixture, call, assign } = serve()
    assign('weather-session')
    expect((await call('weather.localhost', '/v1', fixture.tokens.alice)).version).toBe('1.0.0')
    // alice's token reaches notes too, which also has a live 1.0.0.
    expect(await call('notes.localhost', '/', fixture.tokens.alice, 'weather-session')).toMatchObject({
      status: 404,
      version: null,
      body: { error: { data: { error: 'session_not_found' } } },
    })
    expect(await call('weather.localhost', '/', fixture.tokens.alice, 'weather-session')).toMatchObject({ status: 200, version: '1.0.0' })
    expect(fixture.errors).toEqual([])
  })

  it('to the same user at another version line: the open session does not move to it', async () => {
    const { fixture, call, assign } = serve()
    assign('same-id')
    expect((await call('weather.localhost', '/v1', fixture.tokens.alice)).version).toBe('1.0.0')
    expect((await call('weather.localhost', '/v2', fixture.tokens.alice)).version).toBe('2.0.0')
    expect(await call('weather.localhost', '/', fixture.tokens.alice, 'same-id')).toMatchObject({ status: 200, version: '1.0.0' })
    expect((await call('weather.localhost', '/v2', fixture.tokens.alice, 'same-id')).status).toBe(404)
  })

  it('a new session opened on a request that carries another’s id (a client initializing again) gets no pin, and onError says so rather than leaving its 404s unexplained; the old session keeps its pin, and a DELETE answered with another id ends only the old pin', async () => {
    const fixture = createFixture()
    let opened = 0
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      // Every request opens a session here, whatever id it carries, with the status asked for.
      handler: (request, context) =>
        new Response(JSON.stringify({ jsonrpc: '2.0', id: 1, result: { version: context.version } }), {
          status: Number(request.headers.get('x-status') ?? 200),
          headers: { 'content-type': 'application/json', 'mcp-session-id': `s${++opened}` },
        }),
    })
    const call = async (sessionId?: string, method = 'POST', status = 200) => {
      const response = await handle(
        new Request('http://weather.localhost/v1', {
          method,
          headers: {
            authorization: `Bearer ${fixture.tokens.alice}`,
            'content-type': 'application/json',
            'x-status': String(status),
            ...(sessionId && { 'mcp-session-id': sessionId }),
          },
          ...(method === 'POST' && { body: '{"jsonrpc":"2.0","id":1,"method":"initialize"}' }),
        }),
        { clientAddress: '127.0.0.1' },
      )
      return { status: response.status, version: response.headers.get('x-mcp-version') }
    }
    expect(await call()).toEqual({ status: 200, version: '1.0.0' })
    fixture.apps.deploy('app_weather', '1.1.0')
    expect(await call('s1')).toEqual({ status: 200, version: '1.0.0' })
    expect(fixture.errors.map((e) => [e.context, String(e.error)])).toEqual([
      ['session store', expect.stringContaining('opened a session on a request that carries the id of another')],
    ])
    expect(await call('s2')).toEqual({ status: 404, version: null })
    // The old session is as it was; its DELETE, answered with yet another id, ends it, and
    // pins nothing.
    expect(await call('s1')).toEqual({ status: 200, version: '1.0.0' })
    expect(await call('s1', 'DELETE')).toEqual({ status: 200, version: '1.0.0' })
    expect(await call('s1')).toEqual({ status: 404, version: null })
    expect(await call('s4')).toEqual({ status: 404, version: null })
    // A refusal of the handler's that names another id opens nothing: not reported. Its 404
    // (it no longer knows the session) ends the old pin, whatever id it names.
    expect(await call()).toEqual({ status: 200, version: '1.1.0' })
    const reported = fixture.errors.length
    expect(await call('s5', 'POST', 400)).toEqual({ status: 400, version: '1.1.0' })
    expect(await call('s5', 'POST', 404)).toEqual({ status: 404, version: '1.1.0' })
    expect(fixture.errors).toHaveLength(reported)
    expect(await call('s5')).toEqual({ status: 404, version: null })
  })

  it('an id no request may carry (past 256 characters, or with a space): not pinned, and onError says so rather than leaving its 404s unexplained', async () => {
    for (const id of ['s'.repeat(257), 'a b']) {
      const { fixture, call, assign } = serve()
      assign(id)
      expect((await call('weather.localhost', '/v1', fixture.tokens.alice)).status).toBe(200)
      expect(fixture.errors).toEqual([{ error: expect.any(Error), context: 'session store' }])
      expect(String(fixture.errors[0]!.error)).toContain('not 1 to 256 visible ASCII characters')
      expect(String(fixture.errors[0]!.error)).not.toContain(id)
    }
    // 256 visible characters are pinned as any other id.
    const { fixture, call, assign } = serve()
    assign('s'.repeat(256))
    expect((await call('weather.localhost', '/v1', fixture.tokens.alice)).status).toBe(200)
    expect(await call('weather.localhost', '/v1', fixture.tokens.alice, 's'.repeat(256))).toMatchObject({ status: 200, version: '1.0.0' })
    expect(fixture.errors).toEqual([])
  })
})

describe('a session id assigned twice, on an asynchronous session store', () => {
  it('the new session’s open stream does not keep the other session’s pin alive', async () => {
    const fixture = createFixture()
    const memory = createMemorySessionStore()
    const reads: string[] = []
    const sessions: SessionStore = {
      get: async (id, ttl) => (reads.push(id), memory.get(id, ttl)),
      set: async (id, pin, ttl) => memory.set(id, pin, ttl),
      delete: async (id) => memory.delete(id),
    }
    await sessions.set('dup', { appId: 'app_notes', version: '1.0.0', subject: 'carol' }, 60_000)
    // The keep-alive's interval, driven by the test (no sleeping).
    const ticks: Array<() => void> = []
    const timers = { setInterval: (tick: () => void) => (ticks.push(tick), tick), clearInterval: (tick: unknown) => void ticks.splice(ticks.indexOf(tick as () => void), 1) }
    const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, sessions, sessionTtlMs: 300, timers })
    let stream!: ReadableStreamDefaultController<Uint8Array>
    const handle = mcpDispatch({
      dispatcher,
      handler: () =>
        new Response(new ReadableStream<Uint8Array>({ start: (controller) => void (stream = controller) }), {
          headers: { 'content-type': 'text/event-stream', 'mcp-session-id': 'dup' },
        }),
    })
    const response = await handle(
      new Request('http://weather.localhost/v1', {
        method: 'POST',
        headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json', accept: 'text/event-stream' },
        body: '{"jsonrpc":"2.0","id":1,"method":"initialize"}',
      }),
      { clientAddress: '127.0.0.1' },
    )
    expect(response.status).toBe(200)
    expect(fixture.errors.map((e) => String(e.error))).toEqual([expect.stringContaining('already pinned')])
    // Three keep-alive ticks while the stream is open: none touches carol's pin.
    for (let i = 0; i < 3; i++) for (const tick of [...ticks]) tick()
    await new Promise((resolve) => setImmediate(resolve))
    expect(reads).toEqual([])
    stream.close()
    await response.body!.cancel()
    expect(await memory.get('dup', 60_000)).toEqual({ appId: 'app_notes', version: '1.0.0', subject: 'carol' })
  })

})

/** The memory store answering with promises, a turn later (as Redis does): where a new session's head waits for its pin. */
function asynchronousSessions(): SessionStore {
  const memory = createMemorySessionStore()
  const later = <T>(value: T) => new Promise<T>((resolve) => setImmediate(() => resolve(value)))
  return {
    get: (id, ttl) => later(memory.get(id, ttl) as never),
    set: (id, pin, ttl) => later(memory.set(id, pin, ttl) as never),
    delete: (id) => later(memory.delete(id) as never),
  }
}

describe('a session id the handler sets on the Node adapters, in writeHead\'s headers or with setHeader', () => {
  const stores = { 'the memory store': () => createFixture(), 'a store answering with promises': () => createFixture({ sessions: asynchronousSessions() }) }
  for (const store of ['the memory store', 'a store answering with promises'] as const) {
    for (const framework of ['express', 'fastify'] as const) {
      for (const how of ['in writeHead\'s headers', 'with setHeader before writeHead'] as const) {
        it(`${framework}, ${store}, the id set ${how}: a new session opened in another gets no pin, and onError says so (regression: set with setHeader, it went unreported and its 404s unexplained); the session's own id given back is no new session, and its DELETE ends its pin`, async () => {
          const fixture = stores[store]()
          let opened = 0
          // Every request opens a session here, whatever id it carries, but a DELETE and a
          // request that asks for its own id back (x-echo), as the MCP SDK gives it on each answer.
          const answer = (req: http.IncomingMessage, res: http.ServerResponse) => {
            const carried = req.headers['mcp-session-id'] as string | undefined
            const id = carried !== undefined && (req.method === 'DELETE' || req.headers['x-echo'] !== undefined) ? carried : `s${++opened}`
            if (how === 'with setHeader before writeHead') res.setHeader('mcp-session-id', id).writeHead(200, { 'content-type': 'application/json' })
            else res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': id })
            res.end('{"jsonrpc":"2.0","id":1,"result":{}}')
          }
          let port: number
          let stop: () => Promise<void>
          if (framework === 'express') {
            const app = express()
            app.use(expressAdapter.mcpDispatch({ dispatcher: fixture.dispatcher, onError: fixture.onError }))
            app.use(expressAdapter.routeByVersion(() => (req, res) => answer(req, res)))
            const server = http.createServer(app)
            port = await listen(server)
            stop = () => close(server)
          } else {
            const app = Fastify()
            await app.register(fastifyAdapter.mcpDispatch({ dispatcher: fixture.dispatcher, onError: fixture.onError }))
            app.all('/*', fastifyAdapter.routeByVersion(() => (request, reply) => answer(request.raw, reply.raw)))
            await app.listen({ port: 0, host: '127.0.0.1' })
            port = (app.server.address() as AddressInfo).port
            stop = () => app.close()
          }
          const ask = (sessionId?: string, { method = 'POST', echo = false } = {}) =>
            rawRequest(port, {
              method,
              path: '/v1',
              headers: {
                authorization: `Bearer ${fixture.tokens.alice}`,
                ...(method === 'POST' && { 'content-type': 'application/json' }),
                ...(sessionId && { 'mcp-session-id': sessionId }),
                ...(echo && { 'x-echo': '1' }),
              },
              ...(method === 'POST' && { body: '{"jsonrpc":"2.0","id":1,"method":"initialize"}' }),
            })
          const reported = () => fixture.errors.map((e) => [e.context, String(e.error)])
          try {
            expect((await ask()).status).toBe(200)
            expect((await ask('s1')).status).toBe(200)
            expect(reported()).toEqual([['session store', expect.stringContaining('opened a session on a request that carries the id of another')]])
            // The new session has no pin; the old one keeps its own.
            expect((await ask('s2')).status).toBe(404)
            expect((await ask('s1', { echo: true })).headers['x-mcp-version']).toBe('1.0.0')
            // Its own id given back (every answer of the SDK's transport carries it) reports nothing.
            expect(reported()).toHaveLength(1)
            // Its DELETE, answered with its id, ends its pin.
            expect((await ask('s1', { method: 'DELETE' })).status).toBe(200)
            expect((await ask('s1', { echo: true })).status).toBe(404)
            expect(reported()).toHaveLength(1)
          } finally {
            await stop()
          }
        })
      }
    }
  }
})
