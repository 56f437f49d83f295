/** `npx tsx examples/hono/server.ts` (PORT, default 8803). */
import { createDemo, printUsage } from '../shared/demo.js'
import { serveNode } from '../shared/serve-node.js'
import { createHonoExample } from './app.js'

const demo = await createDemo()
const example = createHonoExample(demo)
// `@hono/node-server` on a `node:http` server, with JSON-RPC answers to what it cannot build a
// `Request` of and to what Node's parser refuses (examples/shared/serve-node.ts).
const { server, port } = await serveNode(example.app.fetch, { port: Number(process.env.PORT ?? 8803), hostname: '127.0.0.1' })
printUsage('Hono', port, demo.token)
const stop = () => {
  server.close()
  void example.close().finally(() => process.exit(0))
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
