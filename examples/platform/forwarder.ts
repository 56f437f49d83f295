/**
 * `npm run forward`: a forwarder on 127.0.0.1 in front of the reference platform that adds
 * what the official MCP conformance runner's client cannot send, an `Authorization` header and
 * an App's `Host`, so the runner can be pointed at an App of `npm start` (docs/platform.md,
 * "The MCP conformance suite"):
 *
 *   npm start                                            # prints the seeded tokens
 *   TOKEN=svc_… npm run forward                          # weather on :8787, listens on :8790
 *   TOKEN=svc_… npm run forward -- --app notes --port 8787 --listen 8791
 *
 * `TOKEN` (or `--token`, which npm echoes with the command line) is the credential every
 * forwarded request carries; `--port` (default `PORT`, else 8787) the platform's port,
 * `--listen` (default `FORWARD_PORT`, else 8790; 0 for any free port) the forwarder's, `--app`
 * the App's slug (default `weather`). It listens on loopback only: whoever reaches it is served
 * as the token's user. The token is never printed.
 * @module
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { fileURLToPath } from 'node:url'
import { parseBearerToken } from 'mcp-dispatch'
import { portOption, readOptions, refuse } from './cli.js'
import { APP_SLUG, RESERVED_SLUG } from './slug.js'

/** Connection errors of a platform that is not there (not started, stopped). */
const NOT_REACHED = new Set(['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT', 'EADDRNOTAVAIL'])

/** A running forwarder. */
export interface Forwarder {
  readonly port: number
  close(): Promise<void>
}

/**
 * Serves on 127.0.0.1 (on `listen`, default any free port) and forwards every request to
 * `127.0.0.1:{port}` with `Host` and `Authorization` replaced, streaming both ways (SSE
 * included); when the client goes away the request to the platform is ended too, so the
 * platform sees the stream cancelled. A platform that cannot be reached is a JSON-RPC 502
 * (`bad_gateway`), printed once on stderr until it answers again.
 */
export async function startForwarder(target: { port: number; host: string; authorization: string; listen?: number }): Promise<Forwarder> {
  /** Whether the last attempt found the platform unreachable (its error is printed once). */
  let unreachable = false
  const server = http.createServer((incoming, outgoing) => {
    const headers = { ...incoming.headers, host: target.host, authorization: target.authorization }
    const upstream = http.request(
      { host: '127.0.0.1', port: target.port, method: incoming.method, path: incoming.url, headers, agent: false },
      (response) => {
        unreachable = false
        outgoing.writeHead(response.statusCode ?? 502, response.headers)
        // An SSE stream may stay silent for a while: the client needs the head now.
        outgoing.flushHeaders()
        response.pipe(outgoing)
      },
    )
    upstream.on('error', (error: NodeJS.ErrnoException) => {
      // The client gone first: its request to the platform was ended on purpose.
      if (outgoing.destroyed) return
      // Once the platform's answer has begun, the answer is cut.
      if (outgoing.headersSent) {
        outgoing.destroy()
        return
      }
      // The platform not reached (not started, stopped): a 502 saying so, and one line on
      // stderr per outage, not an empty reply. Any other failure (a connection it reset, an
      // answer that is no HTTP) is a 502 too, said each time.
      const reached = !NOT_REACHED.has(error.code ?? '')
      if (reached) console.error(`forwarder: the platform at 127.0.0.1:${target.port} failed: ${error.message}`)
      else if (!unreachable) {
        console.error(`forwarder: cannot reach the platform at 127.0.0.1:${target.port}: ${error.message}`)
        unreachable = true
      }
      const body = JSON.stringify({
        jsonrpc: '2.0',
        id: null,
        error: { code: -32603, message: reached ? 'Platform failed' : 'Platform unreachable', data: { error: 'bad_gateway', port: target.port } },
      })
      outgoing.writeHead(502, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), connection: 'close' }).end(body)
    })
    outgoing.on('close', () => upstream.destroy())
    incoming.pipe(upstream)
  })
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(target.listen ?? 0, '127.0.0.1', resolve)
  })
  return {
    port: (server.address() as AddressInfo).port,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}

async function main(): Promise<void> {
  const problems: string[] = []
  const values = readOptions(['token', 'app', 'port', 'listen'], problems)
  const token = values.token ?? process.env.TOKEN ?? ''
  const app = values.app ?? 'weather'
  if (token === '') problems.push('--token (or TOKEN): required, a token `npm start` printed (TOKEN=svc_… npm run forward)')
  // What the dispatcher would take from the header (an RFC 6750 b64token), so nothing else reaches it.
  else if (parseBearerToken(`Bearer ${token}`).kind !== 'bearer') problems.push('--token: not a Bearer token (RFC 6750 b64token)')
  if (!APP_SLUG.test(app)) problems.push(`--app: must be an App's slug (a DNS label in lower case), got ${JSON.stringify(app)}`)
  // `api.localhost` is the token API: the token would be sent there with every request.
  else if (app === RESERVED_SLUG) problems.push(`--app: "${RESERVED_SLUG}" is the token API's host, no App's slug`)
  const port = portOption('--port', values.port ?? process.env.PORT ?? '8787', false, problems)
  const listen = portOption('--listen', values.listen ?? process.env.FORWARD_PORT ?? '8790', true, problems)
  if (problems.length > 0) refuse(problems)
  let forwarder: Forwarder
  try {
    forwarder = await startForwarder({ port, host: `${app}.localhost:${port}`, authorization: `Bearer ${token}`, listen })
  } catch (error) {
    refuse([`--listen: cannot listen on 127.0.0.1:${listen}: ${(error as Error).message}`], 1)
  }
  console.log(`Forwarding http://127.0.0.1:${forwarder.port} to ${app}.localhost:${port} with the token (loopback only).`)
  console.log('The official MCP conformance runner against it (after npm ci --prefix test/conformance):')
  console.log('  test/conformance/node_modules/node/bin/node \\')
  console.log('    test/conformance/node_modules/@modelcontextprotocol/conformance/dist/index.js \\')
  console.log(`    server --url http://127.0.0.1:${forwarder.port}/v1 --suite all -o /tmp/conformance`)
  const stop = () => void forwarder.close().then(() => process.exit(0))
  process.once('SIGINT', stop)
  process.once('SIGTERM', stop)
}

if (process.argv[1] !== undefined && fileURLToPath(import.meta.url) === process.argv[1]) await main()
