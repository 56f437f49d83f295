/** `npx tsx examples/express/server.ts` (PORT, default 8801). */
import type { AddressInfo } from 'node:net'
import { answerClientError } from 'mcp-dispatch/express'
import { cannotListen, createDemo, createNodeServer, examplePort, printUsage } from '../shared/demo.js'
import { createExpressExample } from './app.js'

const port = examplePort(8801)
const demo = await createDemo()
const example = createExpressExample(demo)
// JSON-RPC answers to what Node refuses itself (no `Host`, an unknown `Expect`) and, with
// `answerClientError`, to what its parser refuses (a malformed request, a head past 16 KiB).
const server = createNodeServer(example.app)
server.on('clientError', answerClientError)
// `Expect: 100-continue`: `100 Continue` once the dispatch layer let the request through, so a
// refused upload is answered before its body is sent (docs/adapters.md).
server.on('checkContinue', (req, res) => server.emit('request', req, res))
const refused = (error: Error) => cannotListen(port, error)
server.once('error', refused)
server.listen(port, '127.0.0.1', () => {
  server.off('error', refused)
  printUsage('Express', (server.address() as AddressInfo).port, demo.token)
})
const stop = () => {
  server.closeAllConnections()
  server.close()
  void example.close().finally(() => process.exit(0))
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
