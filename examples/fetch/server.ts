/**
 * `npx tsx examples/fetch/server.ts`: the fetch handler on PORT (default 8804) and, to proxy
 * to, the App's own service on UPSTREAM_PORT (default 0: any free port), both on 127.0.0.1.
 * The App's service starts first, so the handler knows where to proxy before it takes a request.
 */
import { generateKeyPair } from 'jose'
import { serviceUnavailableReply } from 'mcp-dispatch'
import { createIdentitySigner } from 'mcp-dispatch/proxy'
import { toResponse } from 'mcp-dispatch/web'
import { cannotListen, createDemo, examplePort, printUsage } from '../shared/demo.js'
import { type NodeEnv, serveNode } from '../shared/serve-node.js'
import { createFetchHandler } from './handler.js'
import { createUpstreamApp } from './upstream.js'

/** Serves `fetch` on 127.0.0.1 (examples/shared/serve-node.ts: JSON-RPC answers to what it cannot build a `Request` of). */
const listen = (fetch: (request: Request, env: NodeEnv) => Promise<Response>, port: number) => serveNode(fetch, { port, hostname: '127.0.0.1' })

const port = examplePort(8804)
const upstreamPort = examplePort(0, 'UPSTREAM_PORT')
const demo = await createDemo()
const issuer = 'http://platform.localhost'
// In production the key comes from a secret store, so tokens survive restarts.
const { privateKey } = await generateKeyPair('ES256', { extractable: true })
const signer = createIdentitySigner({ issuer, privateKey })

// The App's own service, first. Its verifier needs the platform's JWKS address, known once the
// front server listens: until then (a moment, and only a request sent to it directly) it is 503.
const app: { current?: ReturnType<typeof createUpstreamApp> } = {}
const upstream = await listen(
  async (request) => (app.current ? app.current.fetch(request) : toResponse(serviceUnavailableReply())),
  upstreamPort,
).catch((error: unknown) => cannotListen(upstreamPort, error, 'UPSTREAM_PORT'))
const upstreamOrigin = `http://127.0.0.1:${upstream.port}`

const handler = createFetchHandler({
  dispatcher: demo.dispatcher,
  signer,
  upstream: (context) => `${upstreamOrigin}/mcp/${context.version}`,
})
const front = await listen(
  (request, env) => handler(request, { clientAddress: env.incoming?.socket?.remoteAddress, outgoing: env.outgoing }),
  port,
).catch((error: unknown) => cannotListen(port, error))
app.current = createUpstreamApp({ jwks: `http://127.0.0.1:${front.port}/.well-known/jwks.json`, issuer, audience: upstreamOrigin })

printUsage('fetch handler (proxy)', front.port, demo.token)
console.log(`\nThe App runs as its own service at ${upstreamOrigin}/mcp/<version>`)

const stop = () => {
  front.server.close()
  upstream.server.close()
  void app.current?.close().finally(() => process.exit(0))
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
