/** `npx tsx examples/hono/server.ts` (PORT, default 8803). */
import { cannotListen, createDemo, examplePort, printUsage } from '../shared/demo.js'
import { serveNode } from '../shared/serve-node.js'
import { createHonoExample } from './app.js'

const port = examplePort(8803)
const demo = await createDemo()
const example = createHonoExample(demo)
// `@hono/node-server` on a `node:http` server, with JSON-RPC answers to what it cannot build a
// `Request` of and to what Node's parser refuses (examples/shared/serve-node.ts).
const { server, port: listening } = await serveNode(example.app.fetch, { port, hostname: '127.0.0.1' }).catch((error: unknown) => cannotListen(port, error))
// `Expect: 100-continue`: `100 Continue` once the dispatch layer let the request through (the
// example passes `outgoing`, which the Web adapter sends it on).
server.on('checkContinue', (req, res) => server.emit('request', req, res))
printUsage('Hono', listening, demo.token)
const stop = () => {
  server.close()
  void example.close().finally(() => process.exit(0))
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
