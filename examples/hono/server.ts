/** `npx tsx examples/hono/server.ts` (PORT, default 8790). */
import type { AddressInfo } from 'node:net'
import { serve } from '@hono/node-server'
import { answerClientError } from 'mcp-dispatch/web'
import { createDemo, printUsage } from '../shared/demo.js'
import { createHonoExample } from './app.js'

const demo = await createDemo()
const example = createHonoExample(demo)
const server = serve({ fetch: example.app.fetch, port: Number(process.env.PORT ?? 8790), hostname: '127.0.0.1' }, (info: AddressInfo) =>
  printUsage('Hono', info.port, demo.token),
)
// What Node's parser refuses (a malformed request, a head past 16 KiB) gets a JSON-RPC body.
server.on('clientError', answerClientError)
const stop = () => {
  server.close()
  void example.close().finally(() => process.exit(0))
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
