/** `npx tsx examples/express/server.ts` (PORT, default 8801). */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { answerClientError } from 'mcp-dispatch/express'
import { cannotListen, createDemo, examplePort, printUsage } from '../shared/demo.js'
import { createExpressExample } from './app.js'

const port = examplePort(8801)
const demo = await createDemo()
const example = createExpressExample(demo)
const server = http.createServer(example.app)
// What Node's parser refuses (a malformed request, a head past 16 KiB) gets a JSON-RPC body.
server.on('clientError', answerClientError)
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
