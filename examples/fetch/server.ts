/**
 * `npx tsx examples/fetch/server.ts` (PORT, default 8791): the fetch handler on PORT and, to
 * proxy to, the App's own service on an ephemeral port, both on 127.0.0.1.
 */
import type { AddressInfo } from 'node:net'
import { serve } from '@hono/node-server'
import { generateKeyPair } from 'jose'
import { createIdentitySigner } from 'mcp-dispatch/proxy'
import { createDemo, printUsage } from '../shared/demo.js'
import { createFetchHandler } from './handler.js'
import { createUpstreamApp } from './upstream.js'

type Env = { incoming?: { socket?: { remoteAddress?: string } } }
type Server = ReturnType<typeof serve>
function listen(fetch: (request: Request, env: Env) => Promise<Response>, port: number): Promise<{ server: Server; port: number }> {
  return new Promise((resolve) => {
    const server: Server = serve({ fetch, port, hostname: '127.0.0.1' }, (info: AddressInfo) => resolve({ server, port: info.port }))
  })
}

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
  Number(process.env.PORT ?? 8791),
)

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
