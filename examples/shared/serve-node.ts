/**
 * A Web-standard `fetch` on Node, as the Hono and fetch examples serve it: `@hono/node-server`'s
 * request listener on a `node:http` server, with the Web adapter's `nodeServerErrorHandler`, so a
 * request it cannot build a `Request` of (a `Host` no URL can hold, a target that is no path)
 * gets a JSON-RPC answer as on the Express and Fastify adapters, not an empty 400;
 * `answerClientError` for what Node's parser refuses (a malformed request, a head past 16 KiB);
 * and `createNodeServer`'s answers to what Node refuses itself (no `Host`, an `Expect`).
 */
import type { Server } from 'node:http'
import type { AddressInfo } from 'node:net'
import { getRequestListener } from '@hono/node-server'
import { answerClientError, nodeServerErrorHandler } from 'mcp-dispatch/web'
import { createNodeServer } from './demo.js'

/** What `@hono/node-server` hands `fetch` beside the request on Node. */
export type NodeEnv = { incoming?: { socket?: { remoteAddress?: string } }; outgoing?: unknown }

/** Listens on `hostname:port` (0: any free port); resolves with the server and its port. */
export async function serveNode(
  fetch: (request: Request, env: NodeEnv) => Response | Promise<Response>,
  options: { port: number; hostname: string },
): Promise<{ server: Server; port: number }> {
  const listener = getRequestListener(fetch, {
    hostname: options.hostname,
    // The host of an HTTP/1.0 request without `Host` (the demo serves its App at any host); an
    // HTTP/1.1 one is refused before this, by `createNodeServer`'s 400.
    errorHandler: nodeServerErrorHandler,
  })
  const server = createNodeServer(listener)
  server.on('clientError', answerClientError)
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject)
    server.listen(options.port, options.hostname, () => resolve())
  })
  return { server, port: (server.address() as AddressInfo).port }
}
