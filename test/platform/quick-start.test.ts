/**
 * The README's quick start, as written: `npm start` serves the reference platform, prints a
 * `curl` command, and that command (run by curl, which resolves `*.localhost` itself) gets the
 * App's tools with the version headers. PORT=0 lets the system choose the ports.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process'
import { connect } from 'node:net'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { rawRequest } from '../adapters/helpers.js'

const ROOT = fileURLToPath(new URL('../../', import.meta.url))

let child: ChildProcess
let output = ''
let port: number

beforeAll(async () => {
  // Its own process group, so stopping it stops npm, tsx and the server alike.
  child = spawn('npm', ['start'], { cwd: ROOT, env: { ...process.env, PORT: '0' }, stdio: ['ignore', 'pipe', 'pipe'], detached: true })
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()))
  port = await new Promise<number>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`npm start printed no curl command within 30 s:\n${output}`)), 30_000)
    child.stdout!.on('data', (chunk: Buffer) => {
      output += chunk.toString()
      const listening = /reference platform on http:\/\/127\.0\.0\.1:(\d+)/.exec(output)
      if (listening && /^curl .*$/m.test(output)) {
        clearTimeout(timer)
        resolve(Number(listening[1]))
      }
    })
    child.once('exit', (code) => {
      clearTimeout(timer)
      reject(new Error(`npm start exited (${code}):\n${output}`))
    })
  })
}, 40_000)

afterAll(async () => {
  if (!child?.pid || child.exitCode !== null) return
  const exited = new Promise((resolve) => child.once('exit', resolve))
  process.kill(-child.pid, 'SIGTERM')
  await exited
})

describe('npm start (README quick start)', () => {
  it('prints a curl command that gets the tools of the App, with the version headers', async () => {
    const command = /^curl .*$/m.exec(output)![0]
    expect(command).toContain(`http://weather.localhost:${port}/v1`)
    const { stdout } = await promisify(execFile)('sh', ['-c', command], { timeout: 20_000 })
    expect(stdout).toMatch(/^HTTP\/1\.1 200/)
    expect(stdout).toMatch(/^x-mcp-version: 1\.1\.1\r?$/im)
    expect(stdout).toMatch(/^x-mcp-latest-version: 2\.0\.0\r?$/im)
    const json = JSON.parse(stdout.slice(stdout.indexOf('\r\n\r\n') + 4)) as { result: { tools: Array<{ name: string }> } }
    expect(json.result.tools.map((t) => t.name)).toContain('get_version')
  })

  it('starts the development authorization server it names', async () => {
    const issuer = /development authorization server (http:\/\/127\.0\.0\.1:\d+)/.exec(output)![1]!
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

  it('Expect: 100-continue: answers a refused upload before inviting its body, and invites the token API\'s at once', async () => {
    /** Writes a request head that waits for 100 Continue; answers what came within 1.5 s. */
    const waitingHead = (head: string) =>
      new Promise<string>((resolve) => {
        const socket = connect(port, '127.0.0.1')
        let seen = ''
        const done = () => {
          clearTimeout(timer)
          socket.destroy()
          resolve(seen)
        }
        const timer = setTimeout(done, 1_500)
        socket.on('data', (chunk: Buffer) => (seen += chunk.toString('latin1')))
        socket.on('error', () => {})
        socket.on('close', done)
        socket.write(`${head}Expect: 100-continue\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n`)
      })
    const refused = await waitingHead(`POST /v1 HTTP/1.1\r\nHost: weather.localhost:${port}\r\nAuthorization: Bearer svc_nope\r\n`)
    expect(refused).toMatch(/^HTTP\/1\.1 401 /)
    const api = await waitingHead(`POST /api/tokens HTTP/1.1\r\nHost: api.localhost:${port}\r\n`)
    expect(api).toMatch(/^HTTP\/1\.1 100 Continue\r\n\r\n/)
  })
})
