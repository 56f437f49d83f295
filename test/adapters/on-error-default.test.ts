/**
 * Where an adapter's reports go when it is given no `onError`: to the `onError` of the
 * dispatcher it wraps, when that was made by `createDispatcher` (a platform that set it there
 * hears its adapters' reports there too, not on stderr); to the adapter's own when given; to
 * stderr (`logError`) for a `Dispatcher` made by hand. The Web adapter in process (its handler
 * throws), real Express 5 and Fastify (each mounted where its `basePath` is wrong, which
 * they report).
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import Fastify, { type FastifyInstance } from 'fastify'
import { type Dispatcher, type DispatcherOptions, createDispatcher } from 'mcp-dispatch'
import { mcpDispatch as expressDispatch } from 'mcp-dispatch/express'
import { mcpDispatch as fastifyDispatch } from 'mcp-dispatch/fastify'
import { mcpDispatch as webDispatch } from 'mcp-dispatch/web'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { EXPRESS } from '../helpers/express.js'
import { HOST, createFixture, loopbackFetch } from './helpers.js'

type Reporter = (error: unknown, context: string) => void
const told = (reports: Array<{ error: unknown; context: string }>) => reports.map((r) => [r.context, (r.error as Error).name, (r.error as Error).message.slice(0, 40)])

afterEach(() => {
  vi.restoreAllMocks()
})

/** The Web adapter whose handler throws `boom`: one POST to `/v1` as alice; its status. */
async function webFailure(dispatcher: Dispatcher | DispatcherOptions, token: string, onError?: Reporter): Promise<number> {
  const handle = webDispatch({
    dispatcher,
    handler: () => {
      throw new Error('boom')
    },
    ...(onError && { onError }),
  })
  const request = new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: '{}' })
  return (await handle(request)).status
}

describe('an adapter given no onError', () => {
  it("Web: a handler's failure goes to the onError of the createDispatcher dispatcher it wraps (regression: to stderr); an adapter's own onError takes it instead", async () => {
    const fixture = createFixture()
    const stderr = vi.spyOn(console, 'error').mockImplementation(() => {})
    expect(await webFailure(fixture.dispatcher, fixture.tokens.alice)).toBe(502)
    expect(told(fixture.errors)).toEqual([['handler', 'Error', 'boom']])
    expect(stderr).not.toHaveBeenCalled()

    const own: Array<{ error: unknown; context: string }> = []
    expect(await webFailure(fixture.dispatcher, fixture.tokens.alice, (error, context) => own.push({ error, context }))).toBe(502)
    expect(told(own)).toEqual([['handler', 'Error', 'boom']])
    expect(fixture.errors).toHaveLength(1)
    expect(stderr).not.toHaveBeenCalled()
  })

  it("Web: dispatcher given as options with an onError of their own: the adapter reports there too (regression: to stderr)", async () => {
    const fixture = createFixture()
    const stderr = vi.spyOn(console, 'error').mockImplementation(() => {})
    const heard: Array<{ error: unknown; context: string }> = []
    const options = { ...fixture.dispatcherOptions, onError: (error: unknown, context: string) => void heard.push({ error, context }) }
    expect(await webFailure(options, fixture.tokens.alice)).toBe(502)
    expect(told(heard)).toEqual([['handler', 'Error', 'boom']])
    expect(stderr).not.toHaveBeenCalled()
  })

  it('Web: a Dispatcher made by hand (no onError of createDispatcher to lend) leaves the adapter on stderr', async () => {
    const fixture = createFixture()
    const stderr = vi.spyOn(console, 'error').mockImplementation(() => {})
    const { dispatcher } = fixture
    const byHand: Dispatcher = { basePath: dispatcher.basePath, decide: (request) => dispatcher.decide(request), metadata: (app, baseUrl) => dispatcher.metadata(app, baseUrl) }
    expect(await webFailure(byHand, fixture.tokens.alice)).toBe(502)
    expect(fixture.errors).toEqual([])
    expect(stderr.mock.calls).toEqual([['[mcp-dispatch] handler: Error: boom']])
  })

  it("Express: the mount its basePath misses is told to the dispatcher's onError, once (regression: to stderr)", async () => {
    const fixture = createFixture()
    const stderr = vi.spyOn(console, 'error').mockImplementation(() => {})
    const app = EXPRESS.express()
    app.use('/mcp', expressDispatch({ dispatcher: fixture.dispatcher }))
    const server = http.createServer(app)
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
    try {
      const { port } = server.address() as AddressInfo
      for (let i = 0; i < 2; i++) {
        const res = await loopbackFetch(`http://${HOST}:${port}/mcp/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}`, 'content-type': 'application/json' }, body: '{}' })
        expect(res.status).toBe(404)
      }
    } finally {
      server.closeAllConnections()
      await new Promise((resolve) => server.close(resolve))
    }
    expect(told(fixture.errors)).toEqual([['configuration', 'ConfigurationError', expect.stringContaining('basePath')]])
    expect(stderr).not.toHaveBeenCalled()
  })

  it("Fastify: a route outside its basePath is told to the dispatcher's onError (regression: to stderr)", async () => {
    const fixture = createFixture()
    const stderr = vi.spyOn(console, 'error').mockImplementation(() => {})
    const dispatcher = createDispatcher({ ...fixture.dispatcherOptions, basePath: '/mcp' })
    const app = Fastify() as unknown as FastifyInstance
    const context = async (mcp: FastifyInstance) => {
      await mcp.register(fastifyDispatch({ dispatcher }))
      mcp.get('/status', async () => ({ ok: true }))
    }
    // fastify-plugin's mark: Fastify then ignores the prefix, and the route lands outside.
    ;(context as unknown as Record<symbol, boolean>)[Symbol.for('skip-override')] = true
    await app.register(context, { prefix: '/mcp' })
    await app.ready()
    await app.close()
    expect(told(fixture.errors)).toEqual([['configuration', 'ConfigurationError', expect.stringContaining('basePath')]])
    expect(stderr).not.toHaveBeenCalled()
  })
})
