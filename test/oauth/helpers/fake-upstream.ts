/**
 * A small programmable authorization server on 127.0.0.1: every path is a route the test
 * sets (answer, proxy to a real server, hang until closed), every request is counted, and
 * the whole server can be stopped and started again on the same port.
 */
import { type IncomingMessage, type Server, type ServerResponse, createServer } from 'node:http'
import type { AddressInfo } from 'node:net'

/** What a route answers. `hang` holds the request open until the client gives up or the server stops. */
export type FakeAnswer = { status: number; body?: unknown; headers?: Record<string, string> } | 'hang'

/** A received request, as a route sees it. */
export interface FakeRequest {
  readonly method: string
  readonly path: string
  readonly headers: IncomingMessage['headers']
  readonly body: string
}

export type FakeRoute = (request: FakeRequest) => FakeAnswer | Promise<FakeAnswer>

export interface FakeUpstream {
  /** `http://127.0.0.1:{port}`, also the issuer of the default discovery document. */
  readonly url: string
  /** Sets the answer of a path (exact match, no query). */
  route(path: string, handler: FakeRoute | FakeAnswer): void
  /** Requests received per path. */
  count(path: string): number
  /** Every request received, in order. */
  readonly requests: FakeRequest[]
  /** Requests being held by a `hang` answer. */
  readonly hanging: number
  /** Called when a request arrives (after it is counted). */
  onRequest: ((request: FakeRequest) => void) | undefined
  /** Stops listening and drops open connections (clients then get ECONNREFUSED). */
  stop(): Promise<void>
  /** Listens again on the same port. */
  start(): Promise<void>
  close(): Promise<void>
}

/**
 * Forwards a request to `target` (a real userinfo endpoint, say), headers included.
 */
export function proxyTo(target: string): FakeRoute {
  return async (request) => {
    const res = await fetch(target, {
      method: request.method,
      headers: { ...(request.headers.authorization && { authorization: request.headers.authorization }), accept: 'application/json' },
    })
    const text = await res.text()
    return { status: res.status, body: text === '' ? undefined : JSON.parse(text) }
  }
}

export async function startFakeUpstream(): Promise<FakeUpstream> {
  const routes = new Map<string, FakeRoute>()
  const requests: FakeRequest[] = []
  const held = new Set<ServerResponse>()
  let port = 0
  let server: Server | undefined

  const handle = (req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const request: FakeRequest = {
        method: req.method ?? 'GET',
        path: (req.url ?? '/').split('?', 1)[0]!,
        headers: req.headers,
        body: Buffer.concat(chunks).toString('utf8'),
      }
      requests.push(request)
      fake.onRequest?.(request)
      const route = routes.get(request.path)
      Promise.resolve(route ? route(request) : { status: 404, body: { error: 'not_found' } })
        .then((answer) => {
          if (answer === 'hang') {
            held.add(res)
            res.on('close', () => held.delete(res))
            return
          }
          const body = answer.body === undefined ? '' : typeof answer.body === 'string' ? answer.body : JSON.stringify(answer.body)
          res.writeHead(answer.status, { 'content-type': 'application/json', ...answer.headers })
          res.end(body)
        })
        .catch(() => {
          res.writeHead(502)
          res.end()
        })
    })
  }

  async function listen(): Promise<void> {
    server = createServer(handle)
    await new Promise<void>((resolve, reject) => {
      server!.once('error', reject)
      server!.listen(port, '127.0.0.1', () => resolve())
    })
    port = (server.address() as AddressInfo).port
  }

  async function stop(): Promise<void> {
    const s = server
    server = undefined
    if (!s) return
    await new Promise<void>((resolve) => {
      s.close(() => resolve())
      s.closeAllConnections()
    })
  }

  await listen()
  const url = `http://127.0.0.1:${port}`
  const fake: FakeUpstream = {
    url,
    route(path, handler) {
      routes.set(path, typeof handler === 'function' ? handler : () => handler)
    },
    count: (path) => requests.filter((r) => r.path === path).length,
    requests,
    get hanging() {
      return held.size
    },
    onRequest: undefined,
    stop,
    start: listen,
    close: stop,
  }
  return fake
}
