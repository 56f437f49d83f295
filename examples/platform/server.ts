/**
 * `npm start`: serves the reference platform on PORT (or --port; default 8787).
 *
 *   npm start                       # examples/platform/seed.json
 *   npm start -- --seed my-seed.json
 *   npm start -- --port 9000
 *   npm start -- --trust-proxy 127.0.0.1   # behind a reverse proxy (or TRUST_PROXY)
 *   AUTH_ISSUER=https://auth.example.com npm start   # a real OAuth provider (docs/oauth.md)
 *
 * Without AUTH_ISSUER a development authorization server (dev-auth-server.ts) listens on
 * 127.0.0.1:AUTH_PORT (default PORT + 1), so MCP clients can sign in with no other setup.
 * A bad option, variable or seed is named on stderr (exit 2), before the platform serves.
 */
import { randomBytes } from 'node:crypto'
import { lookup } from 'node:dns/promises'
import { readFileSync } from 'node:fs'
import { resolve as resolvePath } from 'node:path'
import { type IncomingMessage, type ServerResponse, createServer } from 'node:http'
import { fileURLToPath } from 'node:url'
import type { Duplex } from 'node:stream'
import { getRequestListener } from '@hono/node-server'
import {
  ConfigurationError,
  type OAuthValidationMode,
  type Reply,
  applyDeploy,
  checkIpAllowlist,
  compileAllowlist,
  compileTrustProxy,
  compileVersions,
  invalidHostReply,
  jsonRpcErrorReply,
  methodNotAllowedReply,
  parseVersionPath,
  resolveVersion,
  serviceUnavailableReply,
} from 'mcp-dispatch'
import { answerClientError, answerExpectationFailed, nodeServerErrorHandler, nodeServerFault, toResponse } from 'mcp-dispatch/web'
import { portOption, readOptions, refuse } from './cli.js'
import { createPlatform, parseSeed } from './index.js'

// Every setting is checked before the platform serves: each bad one is named on stderr (exit 2).
const problems: string[] = []
const values = readOptions(['seed', 'port', 'trust-proxy'], problems)
// A relative `--seed` is read from where `npm start` was typed (npm runs the script from the
// package root, and says where it was started in INIT_CWD; an INIT_CWD inherited by a run of
// another kind is not this one's), and named in full.
const typedIn = process.env.npm_lifecycle_event === 'start' ? process.env.INIT_CWD : undefined
const seedPath = values.seed === undefined ? fileURLToPath(new URL('./seed.json', import.meta.url)) : resolvePath(typedIn ?? process.cwd(), values.seed)
// PORT=0: any free port (the tests' way), and the authorization server's too.
const port = portOption('--port (or PORT)', values.port ?? process.env.PORT ?? '8787', true, problems)
// The reverse proxy in front, if any (docs/adapters.md, "Behind a reverse proxy"): a hop count,
// or the proxies' addresses and CIDR ranges separated by commas. Without it, X-Forwarded-For
// and X-Forwarded-Proto are ignored, and every client of a proxy has the proxy's address.
const trustProxy = ((raw: string | undefined): number | string[] | undefined => {
  if (raw === undefined || raw.trim() === '') return undefined
  const setting = /^\s*\d+\s*$/.test(raw) ? Number(raw) : raw.split(',').map((entry) => entry.trim())
  try {
    compileTrustProxy(setting)
    return setting
  } catch (error) {
    problems.push(`--trust-proxy (or TRUST_PROXY): ${(error as Error).message}`)
    return undefined
  }
})(values['trust-proxy'] ?? process.env.TRUST_PROXY)
const seed = (() => {
  try {
    return JSON.parse(readFileSync(seedPath, 'utf8'))
  } catch (error) {
    // One line, as every problem: JSON.parse quotes the file's text, line breaks and all.
    problems.push(`--seed: cannot read ${seedPath} as JSON: ${(error as Error).message.replace(/\r?\n/g, '\\n')}`)
    return undefined
  }
})()
if (seed !== undefined) {
  try {
    // Its shape now; what refers to what, createPlatform below.
    if (parseSeed(seed).users.length === 0 && !process.env.AUTH_ISSUER) {
      problems.push('--seed: the development authorization server signs in the seed\'s users, and it has none: add one to "users", or set AUTH_ISSUER')
    }
  } catch (error) {
    problems.push(`--seed ${seedPath}: ${(error as Error).message}`)
  }
}

// OAuth (docs/oauth.md): an external authorization server when AUTH_ISSUER is set, else the
// development one on loopback, which signs in seed users without a password.
const authMode = (process.env.AUTH_MODE ?? 'userinfo') as OAuthValidationMode
if (!['userinfo', 'jwt', 'introspection'].includes(authMode)) problems.push(`AUTH_MODE: must be userinfo, jwt or introspection, got ${JSON.stringify(authMode)}`)
const authPort = (() => {
  if (process.env.AUTH_ISSUER) return 0 // no development server
  if (process.env.AUTH_PORT !== undefined) return portOption('AUTH_PORT', process.env.AUTH_PORT, true, problems)
  if (port === 65_535) problems.push('AUTH_PORT: PORT + 1 is no port (PORT=65535): set AUTH_PORT')
  // PORT + 1; PORT=0 (any free port) gives the authorization server any free port too. A bad
  // PORT is named above, once.
  return port > 0 && port < 65_535 ? port + 1 : 0
})()
// Named in a failure to listen: a port the user never set (PORT + 1) is named as derived, so a
// second `npm start` on the same PORT is recognised for what it is.
const authPortSource =
  process.env.AUTH_PORT !== undefined ? 'AUTH_PORT' : `AUTH_PORT (the development authorization server's, PORT + 1; is the platform already running? set PORT or AUTH_PORT)`
// The development authorization server would take the platform's own port first.
if (authPort > 0 && authPort === port) problems.push(`AUTH_PORT: must differ from PORT (both ${port})`)
// An external server's introspection endpoint authenticates the platform: without the
// client's credentials every token would be refused there, request after request.
if (process.env.AUTH_ISSUER && authMode === 'introspection') {
  for (const name of ['AUTH_CLIENT_ID', 'AUTH_CLIENT_SECRET']) {
    if (!process.env[name]) problems.push(`${name}: is required with AUTH_MODE=introspection and AUTH_ISSUER (the platform's introspection client)`)
  }
}
if (problems.length > 0) refuse(problems)

const devIntrospectionClient = { clientId: 'mcp-dispatch-platform', clientSecret: randomBytes(24).toString('base64url') }
const devAuth = process.env.AUTH_ISSUER
  ? undefined
  : // Imported only when used: oidc-provider warns on Node 20 as it loads ("Unsupported runtime"),
    // which an external AUTH_ISSUER has no reason to print.
    await (await import('./dev-auth-server.js')).startDevAuthServer({
      accounts: (seed.users ?? []).map((u: { id: string }) => u.id),
      port: authPort,
      ...(authMode !== 'userinfo' && { resourceIndicators: { accessTokenFormat: authMode === 'jwt' ? 'jwt' : 'opaque' } }),
      ...(authMode === 'introspection' && { introspectionClient: devIntrospectionClient }),
    }).catch((error: unknown) =>
      refuse([`${(error as NodeJS.ErrnoException).syscall === 'listen' ? `${authPortSource}: cannot listen on 127.0.0.1:${authPort}` : 'development authorization server'}: ${(error as Error).message}`], 1),
    )
// Blank is the default; list entries are trimmed (`a, b` is `a` and `b`).
const audience = process.env.AUTH_AUDIENCE?.trim() || undefined
/** The variable behind each option of the OAuth validator that this script sets from one. */
const SETTING_OF: Readonly<Record<string, string>> = {
  issuer: 'AUTH_ISSUER',
  userinfoEndpoint: 'AUTH_USERINFO_ENDPOINT',
  audience: 'AUTH_AUDIENCE',
  introspection: 'AUTH_CLIENT_ID, AUTH_CLIENT_SECRET',
  'introspection.clientId': 'AUTH_CLIENT_ID',
  'introspection.clientSecret': 'AUTH_CLIENT_SECRET',
}
const platform = (() => {
  try {
    return createPlatform({
      seed,
      ...(trustProxy !== undefined && { trustProxy }),
      authorizationServer: {
        issuer: process.env.AUTH_ISSUER || devAuth!.issuer, // unset or empty: the development server
        mode: authMode,
        // The development server runs in this process: an address may have as many made-up bearer
        // strings refused (401) a minute as made-up API tokens (the token service's
        // `unknownTokenBudget`, 600), not the 60 that spare a real provider's endpoint.
        ...(devAuth && { clientBudget: { limit: 600 } }),
        ...(process.env.AUTH_USERINFO_ENDPOINT && { userinfoEndpoint: process.env.AUTH_USERINFO_ENDPOINT }),
        // `AUTH_AUDIENCE=app` (the default in jwt and introspection modes) binds each token to its App.
        ...((audience ?? (authMode === 'userinfo' ? undefined : 'app')) !== undefined && {
          audience: !audience || audience === 'app' ? ({ resource }: { resource: string }) => resource : audience.split(',').map((entry) => entry.trim()),
        }),
        ...(authMode === 'introspection' && {
          introspection: devAuth
            ? devIntrospectionClient
            : { clientId: process.env.AUTH_CLIENT_ID ?? '', clientSecret: process.env.AUTH_CLIENT_SECRET ?? '' },
        }),
        // No onEvent: the validator's own log writes what an operator must act on (a 503, the
        // breaker opening and closing), at most a line of each kind per 10 s.
      },
    })
  } catch (error) {
    // An AUTH_ setting the library refuses, named by its variable; else a seed whose references
    // do not hold (an unknown user, a version the deploy rule refuses).
    if (error instanceof ConfigurationError) refuse([`${SETTING_OF[error.option] ?? error.option}: ${error.message}`])
    return refuse([`--seed ${seedPath}: ${(error as Error).message}`])
  }
})()

// An empty HOST is none: loopback, as unset (and the host of a request without `Host`).
const hostname = process.env.HOST || '127.0.0.1'
/** The 400 for a request target @hono/node-server could not build a `Request` of (`nodeServerFault`). */
const INVALID_TARGET = jsonRpcErrorReply(400, { code: -32600, message: 'Invalid request target', data: { error: 'invalid_request', field: 'path' } })
/** Set by a stop (SIGTERM, SIGINT): see `stop`. */
let stopping = false
const listener = getRequestListener(
  async (request, env: { incoming?: { socket?: { remoteAddress?: string } }; outgoing?: unknown }) => {
    const response = await platform.fetch(request, { clientAddress: env.incoming?.socket?.remoteAddress, outgoing: env.outgoing })
    // A `subscriptions/listen` taken in before a stop, whose stream opened after it: ended too.
    if (stopping) platform.endStreams()
    return response
  },
  {
    // The host of a request without `Host` (HTTP/1.0): answered as any unknown host is (404).
    hostname,
    // A request no `Request` can be built from: a JSON answer naming what is wrong, the Host
    // (`a@b`, `b:99999`, `b/x`) as the Express and Fastify adapters name it, or the request
    // target (a backslash in the path, where the Node adapters answer 404), instead of
    // @hono/node-server's empty 400. platform.fetch itself never throws.
    errorHandler: (error) => (nodeServerFault(error) === 'target' ? toResponse(INVALID_TARGET) : nodeServerErrorHandler(error)),
  },
)
// A client has 20 s for its headers and 60 s for its whole request (Node: 60 s and 300 s), so
// a trickle holds a connection for about a minute, not five (responses, SSE streams
// included, are not limited by these). Node checks them every `connectionsCheckingInterval`
// (default 30 s, which would let them run up to half a minute late): every 2 s here.
//
// An HTTP/1.1 request without `Host` is refused here rather than by Node (`requireHostHeader`,
// whose 400 has no body): RFC 9112 section 3.2 asks for 400, and it gets the JSON-RPC body of
// every other refusal. What Node's parser refuses before any handler (a malformed request line,
// an unknown method, a head past 16 KiB, a head or request past its time) gets the same kind of
// body from `answerClientError`.
// The answers still being written on each connection, each with what ends it (see `serve`): a
// CONNECT pipelined behind a request waits for them, so its 405 is never read as that request's
// answer.
type Answers = Map<ServerResponse, () => void>
const answering = new WeakMap<Duplex, Answers>()
// Each answer's end: written, or its connection closed.
const endOf = new WeakMap<ServerResponse, Promise<void>>()
// The answers being written to requests other than GET (a tool call, a token API call): a stop
// lets them finish (see `stop`). A GET on an MCP path is a session's stream, which lasts until
// the session closes, and a client resumes it elsewhere. Each with the answers of its connection.
const inFlight = new Map<ServerResponse, Answers>()
// The connections a CONNECT was sent on: its 405 ends them (see below), not a stop.
const connecting = new WeakSet<Duplex>()
const serve = (req: IncomingMessage, res: ServerResponse) => {
  const socket = req.socket
  let open = answering.get(socket)
  if (open === undefined) {
    const answers: Answers = new Map()
    answering.set(socket, (open = answers))
    // An answer queued behind one that closed the connection (a request pipelined behind a
    // refusal with `Connection: close`) is given no socket by Node and never emits 'close'
    // itself: the connection's close ends it (regression: a stop waited its whole drain for it,
    // and it was kept for the life of the process).
    socket.once('close', () => {
      for (const end of [...answers.values()]) end()
    })
  }
  let resolve!: () => void
  endOf.set(res, new Promise<void>((done) => (resolve = done)))
  const answers = open
  const end = () => {
    if (!answers.delete(res)) return
    inFlight.delete(res)
    resolve()
    // Once stopping, a connection ends when its last answer has been written: an event stream
    // says `Connection: keep-alive` itself (the SDK's, in a session), which would keep it open.
    if (stopping && answers.size === 0 && !connecting.has(socket)) socket.end()
  }
  answers.set(res, end)
  if (req.method !== 'GET' && !stopping) inFlight.set(res, answers)
  res.once('close', end)
  // A request on a connection kept alive after the stop began (none can open now): 503 and the
  // connection closes, so its client goes elsewhere. It is not waited for, so it is never taken
  // in to be cut with no answer when the drain ends.
  if (stopping) return answerAndClose(res, serviceUnavailableReply())
  if (req.headers.host === undefined && req.httpVersionMajor === 1 && req.httpVersionMinor >= 1) return answerAndClose(res, invalidHostReply())
  return listener(req, res)
}
/** Writes a refusal of the server's own, and closes the connection after it. */
function answerAndClose(res: ServerResponse, reply: Reply): void {
  res.writeHead(reply.status, { ...reply.headers, 'content-length': Buffer.byteLength(reply.body!), connection: 'close' }).end(reply.body)
}
const server = createServer(
  { requestTimeout: 60_000, headersTimeout: 20_000, connectionsCheckingInterval: 2_000, requireHostHeader: false },
  serve,
)
server.on('clientError', answerClientError)
// An `Expect` other than `100-continue`: Node's 417, with the JSON-RPC body of every refusal.
server.on('checkExpectation', answerExpectationFailed)
// `CONNECT` (a proxy's method) reaches no request handler in Node: without a listener Node
// closes the socket with no answer. This server is no proxy: 405, with the methods it serves.
server.on('connect', async (_req: IncomingMessage, socket: Duplex) => {
  const reply = methodNotAllowedReply('GET, POST, DELETE, OPTIONS')
  const head = Object.entries({ ...reply.headers, 'content-length': String(Buffer.byteLength(reply.body!)), connection: 'close' })
  socket.on('error', () => {})
  connecting.add(socket)
  await Promise.all([...(answering.get(socket)?.keys() ?? [])].map((res) => endOf.get(res)))
  if (socket.destroyed || socket.writableEnded) return
  socket.end(`HTTP/1.1 ${reply.status} Method Not Allowed\r\n${head.map(([name, value]) => `${name}: ${value}\r\n`).join('')}\r\n${reply.body}`)
})
// `Expect: 100-continue` (docs/adapters.md): the dispatch layer sends `100 Continue` once it let
// the request through, so a refused upload is answered before its body is sent; the platform
// sends it at once to the token API and the development endpoints (`api.` host), which read
// every body they get.
server.on('checkContinue', serve)
await new Promise<void>((resolve, reject) => {
  server.once('error', reject)
  server.listen(port, hostname, () => resolve())
}).catch((error: unknown) => {
  // A HOST that is no address of this machine is a bad setting (2); a port taken, or not
  // ours to take, is not (1).
  const code = (error as NodeJS.ErrnoException).code
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN' || code === 'EADDRNOTAVAIL') {
    return refuse([`HOST: cannot listen on ${JSON.stringify(hostname)}: ${(error as Error).message}`])
  }
  return refuse([`--port (or PORT), HOST: cannot listen on ${hostname}:${port}: ${(error as Error).message}`], 1)
})
// The port listened on (PORT=0: the one the system chose).
const listening = (server.address() as { port: number }).port

/** The live versions of a seeded App: a later patch of a minor replaced the earlier one (the deploy rule). */
const liveOf = (a: { versions?: Array<string | { version: string }> }): readonly string[] =>
  (a.versions ?? []).map((v) => (typeof v === 'string' ? v : v.version)).reduce<readonly string[]>((set, version) => applyDeploy(set, version), [])

/**
 * The `curl` to print: the first seeded token that gets 200 from this machine, on the first
 * App of its scope its owner subscribes to and that has a live release; `/v1` where the version
 * `/v1` resolves to is served in process (the README's), else `/`. None when no token can (a seed of its own).
 */
function demoCall(): { name: string; token: string; slug: string; path: string } | undefined {
  // The addresses the printed curl may come from: curl resolves `*.localhost` to 127.0.0.1 and
  // ::1 both, and reaches whichever of them the server listens on.
  const curlFrom = hostname === '::1' ? ['::1'] : hostname === '::' || hostname === '' ? ['127.0.0.1', '::1'] : ['127.0.0.1']
  type SeedToken = { name: string; userId: string; servers: string[]; allowedIps?: string[] | null }
  type SeedApp = { id: string; slug: string; rateLimitPerMinute?: number; versions?: Array<string | { version: string }> }
  for (const t of (seed.tokens ?? []) as SeedToken[]) {
    const token = platform.tokens[t.name]
    const allowlist = t.allowedIps ? compileAllowlist(t.allowedIps) : null
    if (token === undefined || !curlFrom.every((address) => checkIpAllowlist(address, allowlist))) continue
    for (const appId of t.servers) {
      const a = (seed.apps as SeedApp[]).find((x) => x.id === appId)
      const subscribed = (seed.subscriptions ?? []).some((s: { userId: string; appId: string; active: boolean }) => s.userId === t.userId && s.appId === appId && s.active)
      if (a === undefined || !subscribed || a.rateLimitPerMinute === 0) continue
      // What `/v1`, else `/`, serves (the library's own resolution), if served in process.
      const proxied = new Set((a.versions ?? []).flatMap((v) => (typeof v === 'string' ? [] : [v.version])))
      const index = compileVersions(liveOf(a))
      const path = ['/v1', '/'].find((p) => {
        const version = resolveVersion(index, parseVersionPath(p)!)
        return version !== null && !proxied.has(version)
      })
      if (path !== undefined) return { name: t.name, token, slug: a.slug, path }
    }
  }
  return undefined
}

const demo = demoCall()
const owners = new Map<string, { userId: string; servers: string[] }>(
  (seed.tokens ?? []).map((t: { name: string; userId: string; servers: string[] }) => [t.name, t]),
)
// Where a client on this machine reaches it: loopback when it listens on every address.
const wildcard = hostname === '0.0.0.0' || hostname === '::' || hostname === ''
const reachAt = wildcard ? '127.0.0.1' : hostname.includes(':') ? `[${hostname}]` : hostname
console.log(`mcp-dispatch reference platform on http://${reachAt}:${listening}${wildcard ? ` (listening on every address${hostname ? `: ${hostname}` : ''})` : ''} (seed: ${seedPath})`)
for (const a of seed.apps) {
  const live = liveOf(a)
  console.log(`  App ${a.slug}: http://${a.slug}.localhost:${listening}/  (live versions ${live.join(', ') || 'none'})`)
}
console.log(`  Token API: http://api.localhost:${listening}/api/tokens  (dev: POST /dev/session, /dev/deploy, /dev/password-reset)`)
console.log(
  devAuth
    ? `  OAuth: development authorization server ${devAuth.issuer} (${authMode}; signs in as ${seed.users?.[0]?.id ?? '?'} or the login_hint user)`
    : `  OAuth: ${process.env.AUTH_ISSUER} (${authMode})`,
)
// Every seeded token, shown once as the dashboard would at creation: the secrets live in this
// process's memory only, and a restart mints new ones.
if (Object.keys(platform.tokens).length > 0) console.log('  Seeded API tokens:')
for (const [tokenName, secret] of Object.entries(platform.tokens)) {
  const owner = owners.get(tokenName)
  console.log(`    ${tokenName} (${owner?.userId ?? '?'}; ${owner?.servers.join(', ') ?? '?'}): ${secret}`)
}
if (demo) {
  console.log(`\nTry it (token "${demo.name}"):\n`)
  console.log(
    `curl -s http://${demo.slug}.localhost:${listening}${demo.path} -H 'Authorization: Bearer ${demo.token}' -H 'Content-Type: application/json' -d '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' -D -`,
  )
}

// curl and browsers resolve `*.localhost` themselves; Node's resolver (MCP clients on Node)
// does so only where the system's does. Said once at start, where it cannot.
if (seed.apps.length > 0) {
  const names = seed.apps.map((a: { slug: string }) => `${a.slug}.localhost`)
  lookup(names[0]).catch(() => {
    console.log(
      `\nNote: this machine does not resolve ${names[0]} (Node's resolver: MCP clients on Node get ENOTFOUND).` +
        `\n  Add to /etc/hosts: 127.0.0.1 ${[...names, 'api.localhost'].join(' ')}` +
        `\n  or preload the resolver of the repository in the client: NODE_OPTIONS="--import ${fileURLToPath(new URL('../../test/helpers/resolve-localhost.mjs', import.meta.url))}"`,
    )
  })
}

/** How long a stop lets the answers in flight finish before it closes their connections. */
const DRAIN_MS = 10_000

/**
 * SIGTERM or SIGINT: no new connections (and idle kept-alive ones closed), the
 * `subscriptions/listen` streams ended, then the answers in flight to requests other than GET
 * finish, for up to {@link DRAIN_MS}, each on a connection that closes after it: a client whose
 * tool call was cut cannot tell whether it ran. A request sent meanwhile on a connection still
 * open gets 503 (see `serve`). Then the sessions close (their GET streams end), and the process
 * exits 0. A second signal while it drains changes nothing.
 */
const stop = () => {
  if (stopping) return
  stopping = true
  server.close()
  // `subscriptions/listen` streams (POSTs of MCP 2026-07-28) never end on their own: ended now,
  // as the GET streams are at the end, so the drain does not wait for them.
  platform.endStreams()
  // Said to the client where the answer lets it, on the last answer of its connection only: Node
  // closes a connection after an answer that says so, and a pipelined request's answer queued
  // behind it would never be written. An answer that says otherwise (an event stream) has its
  // connection ended once written all the same (see `serve`).
  for (const [res, open] of inFlight) if (!res.headersSent && [...open.keys()].at(-1) === res) res.setHeader('connection', 'close')
  const drained = Promise.all([...inFlight.keys()].map((res) => endOf.get(res)))
  const deadline = new Promise<void>((resolve) => setTimeout(resolve, DRAIN_MS).unref())
  void Promise.race([drained, deadline])
    .then(() => Promise.allSettled([platform.close(), devAuth?.close()]))
    .finally(() => {
      server.closeAllConnections()
      process.exit(0)
    })
}
process.on('SIGINT', stop)
process.on('SIGTERM', stop)
