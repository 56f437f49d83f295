/**
 * `npx tsx examples/fetch/server.ts` (PORT, default 8804): the fetch handler on PORT and, to
 * proxy to, the App's own service on an ephemeral port, both on 127.0.0.1.
 */
import { generateKeyPair } from 'jose'
import { createIdentitySigner } from 'mcp-dispatch/proxy'
import { cannotListen, createDemo, examplePort, printUsage } from '../shared/demo.js'
import { type NodeEnv, serveNode } from '../shared/serve-node.js'
import { createFetchHandler } from './handler.js'
import { createUpstreamApp } from './upstream.js'

/** Serves `fetch` on 127.0.0.1 (examples/shared/serve-node.ts: JSON-RPC answers to what it cannot build a `Request` of). */
const listen = (fetch: (request: Request, env: NodeEnv) => Promise<Response>, port: number) => serveNode(fetch, { port, hostname: '127.0.0.1' })

const port = examplePort(8804)
const demo = await createDemo()
const issuer = 'http://platform.localhost'
// In production the key comes from a secret store, so tokens survive restarts.
const { privateKey } = await generateKeyPair('ES256', { extractable: true })
const signer = createIdentitySigner({ issuer, privateKey })

let upstreamOrigin = ''
const handler = createFetchHandler({
  dispatcher: demo.dispatcher,
  signer,
  upstream: (context) => `${upstreamOrigin}/mcp/${context.version}`,
})
const front = await listen(
  (request, env) => handler(request, { clientAddress: env.incoming?.socket?.remoteAddress }),
  port,
).catch((error: unknown) => cannotListen(port, error))

// The App's own service; it is created once its address (the `aud` it expects) is known.
const app: { current?: ReturnType<typeof createUpstreamApp> } = {}
const upstream = await listen((request) => app.current!.fetch(request), 0)
upstreamOrigin = `http://127.0.0.1:${upstream.port}`
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
