/**
 * The README's quick start, as written: `npm start` serves the reference platform, prints a
 * `curl` command, and that command (run by curl, which resolves `*.localhost` itself) gets the
 * App's tools with the version headers. PORT=0 lets the system choose the ports.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process'
import { lookup } from 'node:dns/promises'
import { once } from 'node:events'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { createServer as createHttpServer } from 'node:http'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { type AddressInfo, type Socket, connect, createServer } from 'node:net'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { rawRequest } from '../adapters/helpers.js'
import { codeBlocks } from '../helpers/docs-samples.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))

/** An npm script running in a process group of its own, so stopping it stops npm, tsx and the server alike. */
interface Script {
  /** What it printed so far, stdout and stderr. */
  readonly output: string
  /** npm's own process. */
  readonly child: ChildProcess
  /** Stops it (at once if it has already exited). */
  stop(): Promise<void>
}

/**
 * Runs `npm <args>` with `env` added to this process's, and resolves once `ready` finds in its
 * output what it waits for, with that; rejects, saying what it printed, when the script exits
 * first or 30 s pass.
 */
function startScript<T>(args: readonly string[], env: NodeJS.ProcessEnv, ready: (output: string) => T | undefined): Promise<{ script: Script; found: T }> {
  const child = spawn('npm', args, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'], detached: true })
  let output = ''
  const script: Script = {
    get output() {
      return output
    },
    child,
    async stop() {
      if (child.pid === undefined || child.exitCode !== null || child.signalCode !== null) return
      const exited = once(child, 'exit')
      process.kill(-child.pid, 'SIGTERM')
      await exited
    },
  }
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`npm ${args.join(' ')}: not ready within 30 s:\n${output}`))
      void script.stop()
    }, 30_000)
    const read = (chunk: Buffer) => {
      output += chunk.toString()
      const found = ready(output)
      if (found === undefined) return
      clearTimeout(timer)
      resolve({ script, found })
    }
    child.stdout!.on('data', read)
    child.stderr!.on('data', read)
    child.once('exit', (code) => {
      clearTimeout(timer)
      reject(new Error(`npm ${args.join(' ')} exited (${code}):\n${output}`))
    })
  })
}

let platform: Script
let port: number
/** What `npm start` printed. */
const output = () => platform.output

beforeAll(async () => {
  const started = await startScript(['start'], { PORT: '0' }, (printed) => {
    const listening = /reference platform on http:\/\/127\.0\.0\.1:(\d+)/.exec(printed)
    return listening && /^curl .*$/m.test(printed) ? Number(listening[1]) : undefined
  })
  platform = started.script
  port = started.found
}, 40_000)

/** Writes `data` on a fresh connection; answers what came before the server closed it, or `timeoutMs` passed. */
function rawExchange(data: string, timeoutMs: number): Promise<string> {
  return new Promise<string>((resolve) => {
    const socket = connect(port, '127.0.0.1')
    let seen = ''
    const timer = setTimeout(() => socket.destroy(), timeoutMs)
    socket.on('data', (chunk: Buffer) => (seen += chunk.toString('latin1')))
    socket.on('error', () => {})
    socket.on('close', () => {
      clearTimeout(timer)
      resolve(seen)
    })
    socket.write(data)
  })
}

afterAll(async () => {
  await platform?.stop()
})

/** Whether the server on `port` takes a new connection. */
function accepts(port: number): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const socket = connect(port, '127.0.0.1')
    socket.once('connect', () => (socket.destroy(), resolve(true)))
    socket.once('error', () => resolve(false))
  })
}

/**
 * An upstream App version (a plain MCP endpoint on 127.0.0.1) that holds every answer until
 * `release()`: to each `tools/list` it lists one tool, `tool<id>` of the request's id.
 */
async function holdingUpstream() {
  let release!: () => void
  const released = new Promise<void>((resolve) => (release = resolve))
  let arrived = 0
  const server = createHttpServer((req, res) => {
    let body = ''
    req.on('data', (chunk: Buffer) => (body += chunk.toString()))
    req.on('end', () => {
      arrived++
      void released.then(() => {
        const { id } = JSON.parse(body) as { id: number }
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id, result: { tools: [{ name: `tool${id}`, inputSchema: { type: 'object' } }] } }))
      })
    })
  })
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`,
    /** Requests that reached it. */
    arrived: () => arrived,
    release,
    close: () => void server.close(),
  }
}

/**
 * `npm start` on a port of its own, for a test that stops it: its demo App's address and token
 * (from the `curl` line it prints), raw requests to it, and `stop()`, which sends SIGTERM to
 * npm's own process (as a container runtime stops it) and waits until no connection is taken.
 */
async function startToStop() {
  const CURL = /^curl -s http:\/\/(\w+)\.localhost:(\d+)(\S*) -H 'Authorization: Bearer (svc_\w+)'/m
  const { script, found } = await startScript(['start'], { PORT: '0' }, (printed) => CURL.exec(printed) ?? undefined)
  const { child } = script
  const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>
  const sockets: Socket[] = []
  const inFlightTaken: Promise<void>[] = []
  const kill = () => {
    for (const socket of sockets) socket.destroy()
    try {
      process.kill(-child.pid!, 'SIGKILL')
    } catch {
      // already gone
    }
  }
  const [, slug, listening, path, token] = found
  const port = Number(listening)
  /** Where `raw` sends: the demo App, or another. */
  interface Target {
    readonly host: string
    readonly path: string
    readonly token: string
  }
  const demo: Target = { host: `${slug}.localhost`, path: path!, token: token! }
  const headers = (extra: Record<string, string> = {}, to = demo) => ({
    authorization: `Bearer ${to.token}`,
    'content-type': 'application/json',
    accept: 'application/json, text/event-stream',
    'mcp-protocol-version': '2025-06-18',
    ...extra,
  })
  /** A POST of `payload` to the App, as written on the wire. */
  const raw = (payload: unknown, extra?: Record<string, string>, to = demo) => {
    const body = JSON.stringify(payload)
    const head = Object.entries({ host: `${to.host}:${port}`, ...headers(extra, to), 'content-length': String(Buffer.byteLength(body)) })
    return `POST ${to.path} HTTP/1.1\r\n${head.map(([name, value]) => `${name}: ${value}\r\n`).join('')}\r\n${body}`
  }
  /**
   * Deploys the notes App's 2.0.0 proxied to `upstream`: where `raw` sends with the target
   * answered (`/v2`, the seeded `notes-only` token).
   */
  const deployNotes = async (upstream: string): Promise<Target> => {
    const deployed = await rawRequest(port, { host: 'api.localhost', path: '/dev/deploy', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ app: 'notes', version: '2.0.0', upstream }) })
    expect(deployed.status).toBe(200)
    return { host: 'notes.localhost', path: '/v2', token: /^ {4}notes-only \(.*\): (svc_\w{44})$/m.exec(script.output)![1]! }
  }
  return {
    child,
    exited,
    port,
    host: demo.host,
    path: demo.path,
    deployNotes,
    sockets,
    headers,
    raw,
    kill,
    /** A raw connection to the platform, closed by `kill`; `seen()`: what it has received so far. */
    connection() {
      const socket = connect(port, '127.0.0.1')
      sockets.push(socket)
      let seen = ''
      socket.on('data', (chunk: Buffer) => (seen += chunk.toString('latin1')))
      socket.on('error', () => {})
      return { socket, seen: () => seen }
    },
    /**
     * A connection whose request is in flight: all of it sent but the last bytes of its body
     * (`rest`), the body once the dispatch layer took the request in (its `100 Continue`, which
     * `closed`'s answers leave out).
     */
    inFlight(payload: unknown, extra?: Record<string, string>) {
      const socket = connect(port, '127.0.0.1')
      sockets.push(socket)
      const whole = raw(payload, { ...extra, expect: '100-continue' })
      const split = whole.indexOf('\r\n\r\n') + 4
      const CONTINUE = 'HTTP/1.1 100 Continue\r\n\r\n'
      let seen = ''
      socket.on('error', () => {})
      socket.write(whole.slice(0, split))
      const taken = new Promise<void>((resolve) => {
        socket.on('data', (chunk: Buffer) => {
          seen += chunk.toString('latin1')
          if (!seen.startsWith(CONTINUE)) return
          seen = seen.slice(CONTINUE.length)
          socket.write(whole.slice(split, -5))
          resolve()
        })
      })
      inFlightTaken.push(taken)
      return { socket, rest: whole.slice(-5), closed: once(socket, 'close').then(() => seen) }
    },
    async stop() {
      await Promise.all(inFlightTaken)
      process.kill(child.pid!, 'SIGTERM')
      await expect.poll(() => accepts(port), { timeout: 10_000, interval: 50 }).toBe(false)
    },
  }
}

describe('npm start (README quick start)', () => {
  it('prints a curl command that gets the tools of the App, with the version headers', async () => {
    const command = /^curl .*$/m.exec(output())![0]
    expect(command).toContain(`http://weather.localhost:${port}/v1`)
    const { stdout } = await promisify(execFile)('sh', ['-c', command], { timeout: 20_000 })
    expect(stdout).toMatch(/^HTTP\/1\.1 200/)
    expect(stdout).toMatch(/^x-mcp-version: 1\.1\.1\r?$/im)
    expect(stdout).toMatch(/^x-mcp-latest-version: 2\.0\.0\r?$/im)
    const json = JSON.parse(stdout.slice(stdout.indexOf('\r\n\r\n') + 4)) as { result: { tools: Array<{ name: string }> } }
    expect(json.result.tools.map((t) => t.name)).toContain('get_version')
  })

  it('the README\'s resolver, preloaded into Node, lets the MCP SDK client reach an App at *.localhost; it is the one the third-party client tests preload', async () => {
    const blocks = codeBlocks('README.md', '## Quick start', '## Integration in 20 lines', 'js')
    expect(blocks, 'README.md prints the resolver').toHaveLength(1)
    const printed = blocks[0]!
    // The repository's copy is the printed module under its doc comment.
    const copy = readFileSync(join(ROOT, 'test/helpers/resolve-localhost.mjs'), 'utf8')
    expect(copy.slice(copy.indexOf('import dns'))).toBe(printed)
    const dir = mkdtempSync(join(tmpdir(), 'mcpd-resolve-localhost-'))
    const preload = join(dir, 'resolve-localhost.mjs')
    writeFileSync(preload, printed)
    const token = /Bearer (svc_\w{44})/.exec(/^curl .*$/m.exec(output())![0])![1]!
    // A client as a reader writes one: the SDK's transport on Node's own fetch, nothing else.
    const client = `
      import { Client } from '@modelcontextprotocol/sdk/client/index.js'
      import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
      const transport = new StreamableHTTPClientTransport(new URL('http://weather.localhost:${port}/v1'), {
        requestInit: { headers: { authorization: 'Bearer ${token}' } },
      })
      const client = new Client({ name: 'readme-client', version: '1.0.0' })
      await client.connect(transport)
      const { tools } = await client.listTools()
      console.log(JSON.stringify({ session: transport.sessionId !== undefined, tools: tools.map((t) => t.name) }))
      await transport.terminateSession()
      await client.close()
    `
    const run = (...flags: string[]) => promisify(execFile)(process.execPath, [...flags, '--input-type=module', '-e', client], { cwd: ROOT, timeout: 20_000 })
    try {
      const { stdout } = await run('--import', preload)
      const seen = JSON.parse(stdout) as { session: boolean; tools: string[] }
      expect(seen.session).toBe(true)
      expect(seen.tools).toContain('get_version')
      // Where the system resolver does not answer for *.localhost (as here: no nss-myhostname),
      // the preload is what made the difference.
      const resolved = await lookup('weather.localhost').then(() => true, () => false)
      if (!resolved) await expect(run()).rejects.toThrow(/ENOTFOUND/)
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })

  it('refuses made-up OAuth tokens from one address with 401, a hundred in a row, not 429: the development server is in process (clientBudget 600)', async () => {
    const tools = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
    const statuses = new Set<number>()
    for (let i = 0; i < 100; i++) {
      const res = await rawRequest(port, {
        host: 'weather.localhost',
        path: '/v1',
        headers: { authorization: `Bearer made-up-${i}-${'x'.repeat(20)}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body: tools,
      })
      statuses.add(res.status)
    }
    expect([...statuses]).toEqual([401])
  })

  it('starts the development authorization server it names', async () => {
    const issuer = /development authorization server (http:\/\/127\.0\.0\.1:\d+)/.exec(output())![1]!
    const discovery = await fetch(`${issuer}/.well-known/openid-configuration`)
    expect(discovery.status).toBe(200)
    expect(((await discovery.json()) as { issuer: string }).issuer).toBe(issuer)
  })

  it('answers a request it cannot build a URL from with JSON-RPC 400 naming what is wrong', async () => {
    const tools = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
    const host = await rawRequest(port, { host: 'a@weather.localhost', path: '/v1', headers: { 'content-type': 'application/json' }, body: tools })
    expect(host.status).toBe(400)
    expect(JSON.parse(host.body)).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Invalid Host header', data: { error: 'invalid_request', field: 'host' } } })
    const target = await rawRequest(port, { host: 'weather.localhost', path: '/x\\..\\v1', headers: { 'content-type': 'application/json' }, body: tools })
    expect(target.status).toBe(400)
    expect(JSON.parse(target.body).error.data).toEqual({ error: 'invalid_request', field: 'path' })
  })

  it('prints every seeded token, each with its owner and servers, each usable on its App', async () => {
    const printed = [...output().matchAll(/^ {4}(\S+) \((user_\w+); ([\w, ]+)\): (svc_\w{44})$/gm)]
    expect(printed.map((m) => [m[1], m[2], m[3]])).toEqual([
      ['demo', 'user_alice', 'app_weather'],
      ['notes-only', 'user_alice', 'app_notes'],
      ['bob', 'user_bob', 'app_weather'],
    ])
    const tools = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
    const call = (slug: string, token: string) =>
      rawRequest(port, { host: `${slug}.localhost`, path: '/v1', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: tools })
    const [demo, notes, bob] = printed.map((m) => m[4]!)
    expect((await call('weather', demo!)).status).toBe(200)
    expect((await call('notes', notes!)).status).toBe(200)
    // Bob's subscription to weather is not active (spec 7: 402).
    expect((await call('weather', bob!)).status).toBe(402)
  })

  it('answers what Node\'s HTTP parser refuses, and an HTTP/1.1 request without Host, with JSON-RPC bodies', async () => {
    const raw = (head: string) => rawExchange(head, 3_000)
    const body = (answer: string) => JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4))
    const method = await raw('FOO /v1 HTTP/1.1\r\nHost: weather.localhost\r\n\r\n')
    expect(method).toMatch(/^HTTP\/1\.1 400 /)
    expect(method).toMatch(/^content-type: application\/json\r$/m)
    expect(body(method)).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32600, message: 'Malformed HTTP request', data: { error: 'invalid_request' } } })
    const big = await raw(`POST /v1 HTTP/1.1\r\nHost: weather.localhost\r\nX-Big: ${'a'.repeat(17_000)}\r\n\r\n`)
    expect(big).toMatch(/^HTTP\/1\.1 431 /)
    expect(body(big).error.data).toEqual({ error: 'invalid_request', field: 'headers' })
    // RFC 9112 section 3.2: 400 for an HTTP/1.1 request without Host; HTTP/1.0 may omit it (an unknown App: 404).
    const hostless = await raw('POST /v1 HTTP/1.1\r\nContent-Length: 0\r\n\r\n')
    expect(hostless).toMatch(/^HTTP\/1\.1 400 /)
    expect(body(hostless).error).toEqual({ code: -32600, message: 'Invalid Host header', data: { error: 'invalid_request', field: 'host' } })
    const old = await raw('POST /v1 HTTP/1.0\r\nContent-Length: 0\r\n\r\n')
    expect(old).toMatch(/^HTTP\/1\.1 404 /)
    expect(body(old).error.data).toEqual({ error: 'not_found' })
    // CONNECT reaches no request handler in Node, which closed the socket with no answer.
    const tunnel = await raw('CONNECT weather.localhost:443 HTTP/1.1\r\nHost: weather.localhost:443\r\n\r\n')
    expect(tunnel).toMatch(/^HTTP\/1\.1 405 /)
    expect(tunnel).toMatch(/^allow: GET, POST, DELETE, OPTIONS\r$/m)
    expect(body(tunnel).error).toEqual({ code: -32000, message: 'Method not allowed', data: { error: 'method_not_allowed' } })
  })

  it('refuses an Origin that is not one as browsers send it (a path, user info, a name not in ASCII, upper case, a default port) under its default allowedOrigins', async () => {
    const demo = /^ {4}demo \(.*\): (svc_\w{44})$/m.exec(output())![1]!
    const tools = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' })
    const from = (origin: string) =>
      rawRequest(port, {
        host: 'weather.localhost',
        path: '/v1',
        headers: { origin, authorization: `Bearer ${demo}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body: tools,
      })
    for (const origin of ['http://localhost:3000/path', 'http://evil.test:1@localhost', 'http://xn--tda.localhost/', 'http://\u00fc.localhost', 'http://LOCALHOST:3000', 'http://localhost:80']) {
      const answer = await from(origin)
      expect(answer.status, origin).toBe(403)
      expect(JSON.parse(answer.body).error.data, origin).toEqual({ error: 'origin_not_allowed' })
      expect(answer.headers['access-control-allow-origin'], origin).toBeUndefined()
    }
    for (const origin of ['http://localhost:3000', 'http://[::1]:3000', 'https://app.example', `http://weather.localhost:${port}`]) {
      expect((await from(origin)).status, origin).toBe(200)
    }
  })

  it('deploys through POST /dev/deploy: a connection opened before keeps its version, a new one gets the new one', async () => {
    const notesToken = /^ {4}notes-only \(.*\): (svc_\w{44})$/m.exec(output())![1]!
    const post = (host: string, path: string, payload: unknown, headers: Record<string, string> = {}) =>
      rawRequest(port, { host, path, headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers }, body: JSON.stringify(payload) })
    const init = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'quick-start', version: '1' } } }
    const opened = await post('notes.localhost', '/v1', init, { authorization: `Bearer ${notesToken}` })
    expect(opened.status).toBe(200)
    expect(opened.headers['x-mcp-version']).toBe('1.0.0')
    const session = opened.headers['mcp-session-id']!
    const deployed = await post('api.localhost', '/dev/deploy', { app: 'notes', version: '1.1.0' })
    expect(deployed.status).toBe(200)
    expect(JSON.parse(deployed.body)).toEqual({ app: 'notes', version: '1.1.0', live: ['0.9.0', '1.0.0', '1.1.0'] })
    const pinned = await post('notes.localhost', '/v1', { jsonrpc: '2.0', id: 2, method: 'tools/list' }, { authorization: `Bearer ${notesToken}`, 'mcp-session-id': session, 'mcp-protocol-version': '2025-06-18' })
    expect(pinned.status).toBe(200)
    expect([pinned.headers['x-mcp-version'], pinned.headers['x-mcp-latest-version']]).toEqual(['1.0.0', '1.1.0'])
    const fresh = await post('notes.localhost', '/v1', { jsonrpc: '2.0', id: 3, method: 'tools/list' }, { authorization: `Bearer ${notesToken}` })
    expect(fresh.headers['x-mcp-version']).toBe('1.1.0')
    const refused = await post('api.localhost', '/dev/deploy', { app: 'notes', version: '1.1.0' })
    expect(refused.status).toBe(409)
    // An upstream the proxy would refuse on every request (502) is refused before it goes live.
    const credentials = await post('api.localhost', '/dev/deploy', { app: 'notes', version: '1.2.0', upstream: 'http://user:pw@127.0.0.1:9/mcp' })
    expect(credentials.status).toBe(400)
    expect(JSON.parse(credentials.body)).toMatchObject({ field: 'upstream', message: 'upstream: must not carry credentials (user info)' })
    expect(credentials.body).not.toContain('pw')
    // A misspelled key is refused by name, not taken for an in-process deploy without it.
    const misspelled = await post('api.localhost', '/dev/deploy', { app: 'notes', version: '1.2.0', upsteam: 'http://127.0.0.1:9/mcp' })
    expect(misspelled.status).toBe(400)
    expect(JSON.parse(misspelled.body)).toMatchObject({ error: 'invalid_request', field: 'upsteam' })
    const still = await post('notes.localhost', '/v1', { jsonrpc: '2.0', id: 4, method: 'tools/list' }, { authorization: `Bearer ${notesToken}` })
    expect([still.status, still.headers['x-mcp-version']]).toEqual([200, '1.1.0'])
  })

  it('npm run forward: serves an App through a forwarder that adds its token and Host (for the conformance runner), and names a bad option', async () => {
    const token = /Bearer (svc_\w{44})/.exec(/^curl .*$/m.exec(output())![0])![1]!
    // The token in the environment: npm echoes a script's arguments.
    const { script: forward, found: listening } = await startScript(['run', 'forward', '--', '--port', String(port), '--listen', '0'], { TOKEN: token }, (printed) => {
      const found = /^Forwarding http:\/\/127\.0\.0\.1:(\d+) to weather\.localhost:(\d+)/m.exec(printed)
      return found && /--suite all/.test(printed) ? Number(found[1]) : undefined
    })
    try {
      expect(forward.output).toContain(`server --url http://127.0.0.1:${listening}/v1 --suite all`)
      expect(forward.output).not.toContain(token)
      const answer = await fetch(`http://127.0.0.1:${listening}/v1`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
      })
      expect([answer.status, answer.headers.get('x-mcp-version')]).toEqual([200, '1.1.1'])
      expect(((await answer.json()) as { result: { tools: Array<{ name: string }> } }).result.tools.map((t) => t.name)).toContain('get_version')
    } finally {
      await forward.stop()
    }
    const { TOKEN: _, ...withoutToken } = process.env
    const refused = await promisify(execFile)('npm', ['run', '--silent', 'forward', '--', '--app', 'Weather', '--listen', '70000'], { cwd: ROOT, env: withoutToken }).then(
      () => undefined,
      (error: { code?: number; stderr?: string }) => error,
    )
    expect(refused?.code).toBe(2)
    expect(refused?.stderr).toContain('--token (or TOKEN): required')
    expect(refused?.stderr).toContain(`--app: must be an App's slug (a DNS label in lower case), got "Weather"`)
    expect(refused?.stderr).toContain('--listen: must be a port number (0: any free port), got "70000"')
    // A token that is no Bearer credential (here one that would add a header) never reaches a request.
    const badToken = 'svc_abc\r\nX-Injected: 1'
    const refusedToken = await promisify(execFile)('npm', ['run', '--silent', 'forward', '--', '--port', '0'], { cwd: ROOT, env: { ...withoutToken, TOKEN: badToken } }).then(
      () => undefined,
      (error: { code?: number; stderr?: string }) => error,
    )
    expect(refusedToken?.code).toBe(2)
    expect(refusedToken?.stderr).toContain('--token: not a Bearer token (RFC 6750 b64token)')
    expect(refusedToken?.stderr).toContain('--port: must be a port number, got "0"')
    expect(refusedToken?.stderr).not.toContain('X-Injected')
  })

  it('npm run forward: a platform it cannot reach is a JSON-RPC 502, said once on stderr (regression: an empty reply, nothing printed)', async () => {
    const closed = createServer()
    await new Promise<void>((resolve) => closed.listen(0, '127.0.0.1', resolve))
    const { port: nothing } = closed.address() as AddressInfo
    await new Promise<void>((resolve) => closed.close(() => resolve()))
    const { script: forward, found: listening } = await startScript(['run', 'forward', '--', '--port', String(nothing), '--listen', '0'], { TOKEN: 'svc_unused' }, (printed) =>
      Number(/^Forwarding http:\/\/127\.0\.0\.1:(\d+)/m.exec(printed)?.[1] ?? NaN) || undefined,
    )
    try {
      for (let i = 0; i < 2; i++) {
        const answer = await fetch(`http://127.0.0.1:${listening}/v1`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })
        expect(answer.status).toBe(502)
        expect(await answer.json()).toEqual({
          jsonrpc: '2.0',
          id: null,
          error: { code: -32603, message: 'Platform unreachable', data: { error: 'bad_gateway', port: nothing } },
        })
      }
      expect(forward.output.match(/cannot reach the platform/g)).toHaveLength(1)
      expect(forward.output).toContain(`forwarder: cannot reach the platform at 127.0.0.1:${nothing}: connect ECONNREFUSED`)
      expect(forward.output).not.toContain('svc_unused')
    } finally {
      await forward.stop()
    }
  })

  it('npm start and npm run forward stop on a signal sent to npm alone, as a container runtime sends it (regression: npm and sh exited, the server went on listening)', async () => {
    const scripts: Array<[readonly string[], NodeJS.ProcessEnv, RegExp]> = [
      [['start'], { PORT: '0' }, /reference platform on http:\/\/127\.0\.0\.1:(\d+)/],
      [['run', 'forward', '--', '--port', String(port), '--listen', '0'], { TOKEN: 'svc_unused' }, /^Forwarding http:\/\/127\.0\.0\.1:(\d+)/m],
    ]
    for (const [args, env, ready] of scripts) {
      for (const signal of ['SIGTERM', 'SIGINT'] as const) {
        const what = `npm ${args.join(' ')}, ${signal}`
        const child = spawn('npm', args, { cwd: ROOT, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'], detached: true })
        let printed = ''
        try {
          const listening = await new Promise<number>((resolve, reject) => {
            const timer = setTimeout(() => reject(new Error(`${what}: not ready within 30 s:\n${printed}`)), 30_000)
            const read = (chunk: Buffer) => {
              printed += chunk.toString()
              const found = ready.exec(printed)
              // npm start is ready once it printed its curl command, the forwarder at once.
              if (found && (args[0] !== 'start' || /^curl .*$/m.test(printed))) {
                clearTimeout(timer)
                resolve(Number(found[1]))
              }
            }
            child.stdout!.on('data', read)
            child.stderr!.on('data', read)
          })
          const exited = once(child, 'exit')
          process.kill(child.pid!, signal) // npm's own process, not its group
          await exited
          // The server (npm's grandchild) has let go of its port too.
          const accepts = () =>
            new Promise<boolean>((resolve) => {
              const socket = connect(listening, '127.0.0.1')
              socket.once('connect', () => (socket.destroy(), resolve(true)))
              socket.once('error', () => resolve(false))
            })
          await expect.poll(accepts, { timeout: 10_000, interval: 100, message: what }).toBe(false)
        } finally {
          // Whatever is left of the group (nothing, once the server stopped).
          try {
            process.kill(-child.pid!, 'SIGKILL')
          } catch {
            // already gone
          }
        }
      }
    }
  }, 120_000)

  it('npm start runs the server as npm\'s own child, with no tsx relay between them (tsx SIGKILLs a child that has not told it of a signal within 30 ms: on a busy machine a stop cut every call in flight; CI saw it)', async () => {
    const stopped = await startToStop()
    try {
      const { stdout } = await promisify(execFile)('ps', ['-o', 'args=', '--ppid', String(stopped.child.pid)])
      expect(stdout.trim().split('\n')).toEqual([expect.stringMatching(/^\S*node --import tsx examples\/platform\/server\.ts$/)])
    } finally {
      stopped.kill()
    }
  })

  it('a stop lets a tool call in flight finish (its answer says Connection: close), takes no new connection meanwhile, then exits 0', async () => {
    const upstream = await holdingUpstream()
    const stopped = await startToStop()
    try {
      const notes = await stopped.deployNotes(upstream.url)
      const call = rawRequest(stopped.port, { host: notes.host, path: notes.path, headers: stopped.headers({}, notes), body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'tools/list' }) })
      await expect.poll(upstream.arrived, { timeout: 10_000 }).toBe(1)
      // No new connection while the call is in flight.
      await stopped.stop()
      // A second signal (an impatient Ctrl-C, a supervisor repeating itself) changes nothing.
      process.kill(stopped.child.pid!, 'SIGINT')
      await new Promise((resolve) => setTimeout(resolve, 300))
      expect(stopped.child.exitCode).toBeNull()
      upstream.release()
      const answer = await call
      expect([answer.status, answer.headers['x-mcp-version'], answer.headers.connection]).toEqual([200, '2.0.0', 'close'])
      expect(JSON.parse(answer.body)).toEqual({ jsonrpc: '2.0', id: 7, result: { tools: [{ name: 'tool7', inputSchema: { type: 'object' } }] } })
      expect(await stopped.exited).toEqual([0, null])
    } finally {
      upstream.release()
      upstream.close()
      stopped.kill()
    }
  }, 60_000)

  it('a stop closes the connection of a session tool call answered in the drain (its event stream says keep-alive), and answers 503 with Connection: close a request sent on it meanwhile, never taking it in to cut it', async () => {
    // Regression: the SDK's event-stream answer in a session carries its own `Connection:
    // keep-alive`, so the connection stayed open; a request sent on it during the drain was
    // served (a new session opened while stopping), and, not waited for, cut with no answer.
    const stopped = await startToStop()
    try {
      const initialize = { jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'stop', version: '1' } } }
      const opened = await rawRequest(stopped.port, { host: stopped.host, path: stopped.path, headers: stopped.headers(), body: JSON.stringify(initialize) })
      const session = opened.headers['mcp-session-id'] as string
      expect(session).toBeTruthy()
      const call = (id: number) => ({ jsonrpc: '2.0', id, method: 'tools/call', params: { name: 'echo', arguments: { text: `call ${id}` } } })
      const a = stopped.inFlight(call(2), { 'mcp-session-id': session })
      const b = stopped.inFlight(call(3), { 'mcp-session-id': session }) // keeps the drain going
      await stopped.stop()
      // The rest of call 2, and a new session's initialize behind it on the same connection.
      a.socket.write(a.rest + stopped.raw(initialize))
      const answered = await a.closed
      expect(stopped.child.exitCode, 'the server closed the connection while draining, not by exiting').toBeNull()
      const [first, second] = answered.split(/(?=HTTP\/1\.1 )/)
      expect(first).toMatch(/^HTTP\/1\.1 200 /)
      expect(first).toMatch(/^content-type: text\/event-stream/im)
      expect(first).toContain('call 2')
      expect(second).toMatch(/^HTTP\/1\.1 503 /)
      expect(second).toMatch(/^connection: close/im)
      expect(second).toMatch(/^retry-after: 1/im)
      expect(second).not.toMatch(/^mcp-session-id:/im)
      expect(JSON.parse(second!.slice(second!.indexOf('\r\n\r\n') + 4))).toMatchObject({ jsonrpc: '2.0', id: null, error: { code: -32005, data: { error: 'temporarily_unavailable' } } })
      // The call still in flight finishes; then the process exits 0.
      b.socket.write(b.rest)
      expect(await b.closed).toContain('call 3')
      expect(await stopped.exited).toEqual([0, null])
    } finally {
      stopped.kill()
    }
  }, 60_000)

  it('a stop answers every request pipelined on a connection before it, not only the first (regression: the first answer said Connection: close, and Node closed the connection with the second unwritten)', async () => {
    const upstream = await holdingUpstream()
    const stopped = await startToStop()
    try {
      const notes = await stopped.deployNotes(upstream.url)
      const { socket, seen } = stopped.connection()
      const list = (id: number) => stopped.raw({ jsonrpc: '2.0', id, method: 'tools/list' }, {}, notes)
      socket.write(list(1) + list(2))
      await expect.poll(upstream.arrived, { timeout: 10_000 }).toBe(2)
      await stopped.stop()
      upstream.release()
      await once(socket, 'close')
      const answers = seen().split(/(?=HTTP\/1\.1 )/)
      expect(answers.map((answer) => answer.slice(0, 15))).toEqual(['HTTP/1.1 200 OK', 'HTTP/1.1 200 OK'])
      expect(answers[0]).toContain('"tool1"')
      expect(answers[1]).toContain('"tool2"')
      expect(answers[1]).toMatch(/^connection: close/im)
      expect(await stopped.exited).toEqual([0, null])
    } finally {
      upstream.release()
      upstream.close()
      stopped.kill()
    }
  }, 60_000)

  it('a request pipelined behind a refusal that closed its connection is not waited for by a stop (regression: Node never closed its answer, and the stop took its whole 10 s drain)', async () => {
    const stopped = await startToStop()
    try {
      // Refused (401, Connection: close) while the next request is already read: Node queues
      // the second's answer behind the first's and gives it no connection.
      const { socket, seen } = stopped.connection()
      const host = `${stopped.host}:${stopped.port}`
      socket.write(
        `POST ${stopped.path} HTTP/1.1\r\nHost: ${host}\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n` +
          `POST ${stopped.path} HTTP/1.1\r\nHost: ${host}\r\nContent-Length: 0\r\n\r\n`,
      )
      await once(socket, 'close')
      expect(seen()).toMatch(/^HTTP\/1\.1 401 /)
      expect(seen().match(/HTTP\/1\.1 /g)).toHaveLength(1)
      const stoppedAt = performance.now()
      await stopped.stop()
      expect(await stopped.exited).toEqual([0, null])
      // Nothing was in flight: no drain to wait for (it lasts 10 s).
      expect(performance.now() - stoppedAt).toBeLessThan(5_000)
    } finally {
      stopped.kill()
    }
  }, 60_000)

  it('a stop ends the open subscriptions/listen streams of MCP 2026-07-28 at once, rather than waiting for them as for answers in flight', async () => {
    // Regression: such a stream is a POST's answer that never ends on its own; the drain waited
    // for it as for a tool call, up to its 10 s deadline, and then cut the calls in flight.
    const stopped = await startToStop()
    try {
      const modern = '2026-07-28'
      const listen = {
        jsonrpc: '2.0',
        id: 1,
        method: 'subscriptions/listen',
        params: {
          notifications: { toolsListChanged: true },
          _meta: { 'io.modelcontextprotocol/protocolVersion': modern, 'io.modelcontextprotocol/clientInfo': { name: 'stop', version: '1' }, 'io.modelcontextprotocol/clientCapabilities': {} },
        },
      }
      const { socket, seen } = stopped.connection()
      const modernHeaders = { 'mcp-protocol-version': modern, 'mcp-method': 'subscriptions/listen' }
      socket.write(stopped.raw(listen, modernHeaders))
      await expect.poll(seen, { timeout: 10_000 }).toContain('notifications/subscriptions/acknowledged')
      // Another taken in before the stop, whose stream opens only after it.
      const late = stopped.inFlight({ ...listen, id: 2 }, modernHeaders)
      const inFlight = stopped.inFlight({ jsonrpc: '2.0', id: 3, method: 'tools/list' }) // a call in flight, keeping the drain going
      await stopped.stop()
      // The stream's chunked body ends while the call is still in flight.
      await expect.poll(() => seen().endsWith('\r\n0\r\n\r\n'), { timeout: 10_000 }).toBe(true)
      late.socket.write(late.rest)
      const lateAnswer = await late.closed
      expect(lateAnswer).toMatch(/^HTTP\/1\.1 200 /)
      expect(lateAnswer.endsWith('\r\n0\r\n\r\n'), lateAnswer).toBe(true)
      expect(stopped.child.exitCode).toBeNull()
      inFlight.socket.write(inFlight.rest)
      expect(await inFlight.closed).toMatch(/^HTTP\/1\.1 200 [^]*"tools"/)
      expect(await stopped.exited).toEqual([0, null])
    } finally {
      stopped.kill()
    }
  }, 60_000)

  it('Expect: 100-continue: answers a refused upload before inviting its body, and invites the token API\'s at once', async () => {
    /** Writes a request head that waits for 100 Continue; answers what came within 1.5 s. */
    const waitingHead = (head: string) =>
      rawExchange(`${head}Expect: 100-continue\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n`, 1_500)
    const refused = await waitingHead(`POST /v1 HTTP/1.1\r\nHost: weather.localhost:${port}\r\nAuthorization: Bearer svc_nope\r\n`)
    expect(refused).toMatch(/^HTTP\/1\.1 401 /)
    const api = await waitingHead(`POST /api/tokens HTTP/1.1\r\nHost: api.localhost:${port}\r\n`)
    expect(api).toMatch(/^HTTP\/1\.1 100 Continue\r\n\r\n/)
    // Any other expectation: Node's 417, with the JSON-RPC body of every refusal.
    const odd = await rawExchange(`POST /v1 HTTP/1.1\r\nHost: weather.localhost:${port}\r\nExpect: 999-odd\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`, 1_500)
    expect(odd).toMatch(/^HTTP\/1\.1 417 /)
    expect(JSON.parse(odd.slice(odd.indexOf('\r\n\r\n') + 4))).toEqual({
      jsonrpc: '2.0',
      id: null,
      error: { code: -32600, message: 'Expectation failed', data: { error: 'invalid_request', field: 'expect' } },
    })
  })
})

describe('npm start -- --seed FILE', () => {
  it('prints a curl command that gets 200 with a seed whose first App and first token do not go together', async () => {
    // The first App (maps) has no 1.x and its owner's token is scoped elsewhere; the first
    // token has an allowlist that keeps this machine out; the second reaches cal at /.
    const seed = {
      apps: [
        { id: 'app_maps', slug: 'maps', name: 'Maps', versions: ['2.0.0'] },
        { id: 'app_cal', slug: 'cal', name: 'Calendar', versions: ['3.1.0', '3.2.0-beta.1'] },
      ],
      users: [{ id: 'u1' }],
      subscriptions: [{ userId: 'u1', appId: 'app_cal', active: true }],
      tokens: [
        { name: 'fenced', userId: 'u1', servers: ['app_cal'], expiresInDays: 7, allowedIps: ['192.0.2.0/24'] },
        { name: 'cal', userId: 'u1', servers: ['app_maps', 'app_cal'], expiresInDays: 7 },
      ],
    }
    const file = join(mkdtempSync(join(tmpdir(), 'mcpd-seed-')), 'seed.json')
    writeFileSync(file, JSON.stringify(seed))
    const { script: started, found: command } = await startScript(['start', '--', '--seed', file], { PORT: '0' }, (printed) => /^curl .*$/m.exec(printed)?.[0])
    try {
      expect(started.output).toContain('Try it (token "cal")')
      expect(command).toMatch(/^curl -s http:\/\/cal\.localhost:\d+\/ /)
      const { stdout } = await promisify(execFile)('sh', ['-c', command], { timeout: 20_000 })
      expect(stdout).toMatch(/^HTTP\/1\.1 200/)
      expect(stdout).toMatch(/^x-mcp-version: 3\.1\.0\r?$/im)
    } finally {
      await started.stop()
    }
  }, 60_000)
})

describe('npm start -- --trust-proxy', () => {
  it('names the reverse proxy in front: a request through it takes the scheme its X-Forwarded-Proto says for the App address; without it the header is ignored', async () => {
    const { script: started, found: listening } = await startScript(['start', '--', '--trust-proxy', '127.0.0.1'], { PORT: '0' }, (printed) => {
      const at = /reference platform on http:\/\/127\.0\.0\.1:(\d+)/.exec(printed)
      return at && /^curl .*$/m.test(printed) ? Number(at[1]) : undefined
    })
    try {
      const resourceOf = async (on: number) => {
        const answer = await rawRequest(on, {
          method: 'GET',
          host: `weather.localhost:${on}`,
          path: '/.well-known/oauth-protected-resource',
          headers: { 'x-forwarded-proto': 'https' },
        })
        expect(answer.status).toBe(200)
        return (JSON.parse(answer.body) as { resource: string }).resource
      }
      expect(await resourceOf(listening)).toBe(`https://weather.localhost:${listening}`)
      // The platform of the quick start trusts no proxy.
      expect(await resourceOf(port)).toBe(`http://weather.localhost:${port}`)
    } finally {
      await started.stop()
    }
  }, 60_000)
})

describe('npm start and npm run forward: bad settings', () => {
  /** Runs an npm script to its end; its exit code and stderr. */
  async function run(args: readonly string[], env: NodeJS.ProcessEnv = {}, cwd = ROOT): Promise<{ code: number; stderr: string }> {
    // A bound for a hang, not a measure: a start that fails after the development authorization
    // server came up took over 30 s under a full suite's load on two cores.
    return promisify(execFile)('npm', ['--silent', ...args], { cwd, env: { ...process.env, PORT: '0', ...env }, timeout: 45_000 }).then(
      ({ stderr }) => ({ code: 0, stderr }),
      (error: { code?: number; stderr?: string }) => ({ code: error.code ?? -1, stderr: error.stderr ?? '' }),
    )
  }

  it('names each bad option, variable or seed on stderr and exits 2, never with a stack trace', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mcpd-bad-seed-'))
    const write = (name: string, text: string) => {
      writeFileSync(join(dir, name), text)
      return join(dir, name)
    }
    const notJson = write('not.json', '{')
    // JSON.parse quotes the text of a short file in its message, line breaks and all.
    const brokenLines = write('lines.json', '{\n  "apps": x\n}\n')
    const badSlug = write('slug.json', JSON.stringify({ apps: [{ id: 'a', slug: 'Bad Slug', name: 'A' }], users: [{ id: 'u' }] }))
    const lowerPatch = write('deploy.json', JSON.stringify({ apps: [{ id: 'a', slug: 'a', name: 'A', versions: ['1.0.1', '1.0.0'] }], users: [{ id: 'u' }] }))
    const noUsers = write('users.json', JSON.stringify({ apps: [{ id: 'a', slug: 'a', name: 'A' }] }))
    const cases: Array<[readonly string[], NodeJS.ProcessEnv, readonly string[]]> = [
      [['start', '--', '--port', '70000'], {}, ['--port (or PORT): must be a port number (0: any free port), got "70000"']],
      [['start'], { PORT: 'abc', AUTH_MODE: 'jwe' }, ['--port (or PORT): must be a port number (0: any free port), got "abc"', 'AUTH_MODE: must be userinfo, jwt or introspection, got "jwe"']],
      [['start'], { PORT: '65535' }, ['AUTH_PORT: PORT + 1 is no port (PORT=65535): set AUTH_PORT']],
      [['start', '--', '--seed', join(dir, 'missing.json')], { AUTH_PORT: '-1' }, [`--seed: cannot read ${join(dir, 'missing.json')} as JSON: ENOENT`, 'AUTH_PORT: must be a port number (0: any free port), got "-1"']],
      [['start', '--', '--seed', notJson], {}, [`--seed: cannot read ${notJson} as JSON:`]],
      [['start', '--', '--seed', brokenLines], { PORT: 'abc' }, [`--seed: cannot read ${brokenLines} as JSON:`, '--port (or PORT): must be a port number']],
      [['start', '--', '--seed', badSlug], {}, [`--seed ${badSlug}: seed apps.0.slug: must be a DNS label in lower case`]],
      // Checked by createPlatform, after the development authorization server started: it stops too.
      [['start', '--', '--seed', lowerPatch], {}, [`--seed ${lowerPatch}: seed apps.0.versions.1 (a): cannot deploy 1.0.0`]],
      [['start', '--', '--seed', noUsers], {}, ['--seed: the development authorization server signs in the seed\'s users, and it has none']],
      [['start'], { AUTH_ISSUER: 'https://auth.example.com/?tenant=1' }, ['AUTH_ISSUER: mcp-dispatch: option "issuer" must have no query or fragment (RFC 8414)']],
      // The introspection client's credentials, before anything starts (regression: an unset
      // AUTH_CLIENT_SECRET served, every token then refused at the provider).
      [['start'], { AUTH_MODE: 'introspection', AUTH_ISSUER: 'https://auth.example.com' }, ['AUTH_CLIENT_ID: is required with AUTH_MODE=introspection', 'AUTH_CLIENT_SECRET: is required with AUTH_MODE=introspection']],
      [['start'], { AUTH_MODE: 'introspection', AUTH_ISSUER: 'https://auth.example.com', AUTH_CLIENT_ID: 'platform', AUTH_CLIENT_SECRET: '' }, ['AUTH_CLIENT_SECRET: is required with AUTH_MODE=introspection']],
      // A blank entry of a list, once the spaces around entries are dropped.
      [['start'], { PORT: '0', AUTH_PORT: '0', AUTH_MODE: 'jwt', AUTH_AUDIENCE: 'http://weather.localhost:8787, ,http://notes.localhost:8787' }, ['AUTH_AUDIENCE: mcp-dispatch: option "audience" must be a non-empty string']],
      // Both servers on one port: a bad pair of settings (regression: exit 1, "PORT: EADDRINUSE").
      [['start'], { PORT: '47388', AUTH_PORT: '47388' }, ['AUTH_PORT: must differ from PORT (both 47388)']],
      // A proxy setting that would let any client choose its address.
      [['start', '--', '--trust-proxy', '0.0.0.0/0'], {}, ['--trust-proxy (or TRUST_PROXY): trustProxy: entry 0 ("0.0.0.0/0") trusts every IPv4 peer']],
      [['start'], { TRUST_PROXY: '10.0.0.1, nginx' }, ['--trust-proxy (or TRUST_PROXY): trustProxy: entry 1 ("nginx") is not an IPv4/IPv6 address or CIDR range']],
      // An unknown option hides nothing else.
      [['start', '--', '--prot', '1'], { PORT: 'abc' }, ["Unknown option '--prot'", '--port (or PORT): must be a port number (0: any free port), got "abc"']],
      [['start', '--', '--bogus', '--port', '70000', '--seed'], {}, ["Unknown option '--bogus'", '--port (or PORT): must be a port number (0: any free port), got "70000"', "Option '--seed <value>' argument missing"]],
      // An address not of this machine is a bad HOST, not a port taken.
      [['start'], { HOST: '192.0.2.1', PORT: '0' }, ['HOST: cannot listen on "192.0.2.1": listen EADDRNOTAVAIL']],
      [['run', 'forward', '--', '--token', 'svc_x', '--listen'], {}, ["Option '--listen <value>' argument missing"]],
      // The token API's host: the token would be sent there.
      [['run', 'forward', '--', '--token', 'svc_x', '--app', 'api'], {}, ['--app: "api" is the token API\'s host, no App\'s slug']],
    ]
    // Four at a time: twenty `npm start`s at once on two cores would each take longer than
    // `run` waits (each starts tsx, which compiles the platform first).
    const results: Array<{ code: number; stderr: string }> = []
    for (let i = 0; i < cases.length; i += 4) {
      results.push(...(await Promise.all(cases.slice(i, i + 4).map(([args, env]) => run(args, env)))))
    }
    for (const [i, { code, stderr }] of results.entries()) {
      const [args, env, expected] = cases[i]!
      const what = `npm ${args.join(' ')} ${JSON.stringify(env)}:\n${stderr}`
      expect(code, what).toBe(2)
      for (const line of expected) expect(stderr, what).toContain(line)
      expect(stderr, what).not.toMatch(/^\s+at /m)
      expect(stderr, what).not.toContain('reference platform on')
      // One line per problem, whatever the problem quotes.
      if (args.includes(brokenLines)) expect(stderr.trim().split('\n'), what).toHaveLength(2)
    }
  }, 300_000)

  it('reads a relative --seed from where npm was started, and names it in full', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'mcpd-relative-seed-'))
    writeFileSync(join(dir, 'mine.json'), JSON.stringify({ apps: [{ id: 'app_a', slug: 'Bad', name: 'A', versions: ['1.0.0'] }], users: [{ id: 'u1' }] }))
    const { code, stderr } = await run(['--prefix', ROOT, 'start', '--', '--seed', 'mine.json'], {}, dir)
    expect(code, stderr).toBe(2)
    expect(stderr).toContain(`--seed ${join(dir, 'mine.json')}: seed apps.0.slug: must be a DNS label in lower case`)
  }, 60_000)

  it('exits 1 naming the address when its port is taken', async () => {
    const taken = createServer()
    await new Promise<void>((resolve) => taken.listen(0, '127.0.0.1', resolve))
    const { port: busy } = taken.address() as AddressInfo
    try {
      const { code, stderr } = await run(['start'], { PORT: String(busy), AUTH_PORT: '0' })
      expect(code).toBe(1)
      expect(stderr).toContain(`--port (or PORT), HOST: cannot listen on 127.0.0.1:${busy}: listen EADDRINUSE`)
      expect(stderr).not.toMatch(/^\s+at /m)
      const auth = await run(['start'], { AUTH_PORT: String(busy) })
      expect(auth.code).toBe(1)
      expect(auth.stderr).toContain(`AUTH_PORT: cannot listen on 127.0.0.1:${busy}: listen EADDRINUSE`)
      // A second `npm start` on the same PORT meets its PORT + 1 taken first: named as derived.
      const derived = await run(['start'], { PORT: String(busy - 1) })
      expect(derived.code).toBe(1)
      expect(derived.stderr).toContain(`AUTH_PORT (the development authorization server's, PORT + 1; is the platform already running? set PORT or AUTH_PORT): cannot listen on 127.0.0.1:${busy}: listen EADDRINUSE`)
    } finally {
      taken.close()
    }
  }, 60_000)
})
