/**
 * The proxy handler against an upstream App that answers at random: any status (outside
 * 200–599 too), hostile and hop-by-hop headers, every content coding (valid, unknown, empty
 * entries), bodies of any size, and connections cut before or after the head. Every answer
 * must be the one docs/adapters.md ("Proxy") gives for it: passed through with the
 * platform-only headers stripped, or the JSON-RPC 502; never a 500, never a throw, never a
 * hang, and no socket or timer left once the upstream is gone.
 *
 * Deterministic: a fixed fast-check seed (`FUZZ_SEED`), `PROXY_FUZZ_CASES` cases.
 */
import * as http from 'node:http'
import { brotliCompressSync, deflateSync, gzipSync } from 'node:zlib'
import fc from 'fast-check'
import { generateKeyPair } from 'jose'
import type { DispatchContext } from 'mcp-dispatch'
import { createIdentitySigner, createProxyHandler } from 'mcp-dispatch/proxy'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { activeResources, leakedHandles } from './support.js'

const SEED = Number(process.env.FUZZ_SEED ?? 20_251_121)
const CASES = Number(process.env.PROXY_FUZZ_CASES ?? 600)
const CONCURRENCY = 8
const UNAVAILABLE = { jsonrpc: '2.0', id: null, error: { code: -32000, message: 'Upstream App unavailable', data: { error: 'upstream_unavailable' } } }

const context: DispatchContext = {
  app: { id: 'app_weather', slug: 'weather', name: 'Weather' },
  identity: { subject: 'alice', method: 'api_token', tokenId: 'tok_1', scopes: ['app_weather'] },
  version: '1.0.0',
  latestVersion: '1.0.0',
  sessionId: undefined,
  baseUrl: 'http://weather.localhost',
  rateLimit: undefined,
} as DispatchContext

/** What the upstream answers to one case. */
interface UpstreamCase {
  status: number
  coding: 'none' | 'identity' | 'gzip' | 'deflate' | 'br' | 'zstd' | 'x-unknown' | 'gzip, '
  type: string | null
  hostile: ReadonlyArray<readonly [string, string]>
  custom: string
  body: Uint8Array
  cut: 'none' | 'before-head' | 'after-head'
  method: 'POST' | 'GET' | 'DELETE'
}

/** Headers the proxy must never hand back to the client (docs/adapters.md, "What crosses"). */
const HOSTILE: ReadonlyArray<readonly [string, string]> = [
  ['set-cookie', 'session=stolen; Path=/'],
  ['www-authenticate', 'Bearer realm="app"'],
  ['strict-transport-security', 'max-age=31536000'],
  ['access-control-allow-origin', '*'],
  ['access-control-allow-credentials', 'true'],
  ['clear-site-data', '"*"'],
  ['alt-svc', 'h3=":443"'],
  ['x-hop', 'named in Connection'],
  ['keep-alive', 'timeout=5'],
  ['proxy-authenticate', 'Basic'],
]

const bodiless = (status: number) => status === 204 || status === 304

const caseArb: fc.Arbitrary<UpstreamCase> = fc.record({
  status: fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom(200, 200, 200, 201, 202, 203, 204, 206, 299) },
    { weight: 2, arbitrary: fc.constantFrom(300, 301, 302, 303, 304, 307, 308) },
    { weight: 3, arbitrary: fc.constantFrom(400, 401, 403, 404, 405, 406, 407, 409, 413, 415, 429, 431) },
    { weight: 2, arbitrary: fc.constantFrom(500, 501, 502, 503, 504, 599) },
    { weight: 1, arbitrary: fc.constantFrom(600, 700, 999) },
  ),
  coding: fc.oneof(
    { weight: 6, arbitrary: fc.constant('none' as const) },
    { weight: 3, arbitrary: fc.constantFrom('identity' as const, 'gzip' as const, 'deflate' as const, 'br' as const) },
    { weight: 1, arbitrary: fc.constantFrom('zstd' as const, 'x-unknown' as const, 'gzip, ' as const) },
  ),
  type: fc.constantFrom('application/json', 'text/event-stream', 'text/plain; charset=utf-8', null),
  hostile: fc.subarray([...HOSTILE]),
  custom: fc.stringMatching(/^[a-zA-Z0-9 ._-]{0,40}$/),
  body: fc.oneof(
    { weight: 3, arbitrary: fc.uint8Array({ maxLength: 2_000 }) },
    { weight: 3, arbitrary: fc.constant(new TextEncoder().encode('{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}')) },
    { weight: 1, arbitrary: fc.integer({ min: 64 * 1024, max: 512 * 1024 }).map((n) => new Uint8Array(n).fill(0x7a)) },
  ),
  cut: fc.oneof({ weight: 10, arbitrary: fc.constant('none' as const) }, fc.constantFrom('before-head' as const, 'after-head' as const)),
  method: fc.constantFrom('POST', 'POST', 'GET', 'DELETE'),
})
  // A 204 or 304 has no body to cut.
  .map((c) => (bodiless(c.status) && c.cut === 'after-head' ? { ...c, cut: 'none' as const } : c))

function encode(body: Uint8Array, coding: UpstreamCase['coding']): Uint8Array {
  if (coding === 'gzip') return gzipSync(body)
  if (coding === 'deflate') return deflateSync(body)
  if (coding === 'br') return brotliCompressSync(body)
  return body
}

/** The upstream App: answers the case named by the request's `x-fuzz-case` header. */
function upstreamApp(cases: readonly UpstreamCase[]): http.Server {
  return http.createServer((req, res) => {
    const c = cases[Number(req.headers['x-fuzz-case'])]
    req.resume()
    req.on('end', () => {
      if (!c || c.cut === 'before-head') {
        res.socket?.destroy()
        return
      }
      const headers: Record<string, string> = { 'x-app-custom': c.custom }
      if (c.type !== null) headers['content-type'] = c.type
      if (c.coding !== 'none') headers['content-encoding'] = c.coding
      for (const [name, value] of c.hostile) headers[name] = value
      if (c.hostile.some(([name]) => name === 'x-hop')) headers.connection = 'x-hop'
      res.writeHead(c.status, headers)
      if (c.cut === 'after-head') {
        res.flushHeaders()
        res.write(encode(c.body, c.coding).subarray(0, 1))
        setImmediate(() => res.socket?.destroy())
        return
      }
      res.end(bodiless(c.status) ? undefined : encode(c.body, c.coding))
    })
  })
}

/** The proxy answers 502 instead of relaying (docs/adapters.md, the table under "Proxy"). */
function refusedByProxy(c: UpstreamCase): boolean {
  return (
    c.cut === 'before-head' ||
    c.status < 200 ||
    c.status > 599 ||
    (c.status >= 300 && c.status < 400) ||
    c.status === 401 ||
    c.status === 407 ||
    c.coding === 'zstd' ||
    c.coding === 'x-unknown' ||
    c.coding === 'gzip, '
  )
}

/** Why the proxy's answer to `c` is wrong, or `undefined`. */
async function judge(c: UpstreamCase, response: Response): Promise<string | undefined> {
  // A 500 only ever as the upstream's own answer, passed through.
  if (response.status === 500 && c.status !== 500) return 'a 500 of its own'
  if (refusedByProxy(c)) {
    if (response.status !== 502) return `${response.status}, expected 502`
    const body = await response.json().catch(() => undefined)
    return JSON.stringify(body) === JSON.stringify(UNAVAILABLE) ? undefined : `502 body ${JSON.stringify(body)}`
  }
  // A head with neither Content-Type nor length is answered only once the first byte of its
  // body has come (to tell an empty answer): cut before that byte could be read, it is a 502.
  // (The upstream's own 502, passed through, is told from it by the upstream's header, which
  // the proxy's answer never has: regression, a cut 502 of the upstream was judged a pass-through.)
  if (c.cut === 'after-head' && c.type === null && response.status === 502 && (c.status !== 502 || response.headers.get('x-app-custom') === null)) {
    const body = await response.json().catch(() => undefined)
    return JSON.stringify(body) === JSON.stringify(UNAVAILABLE) ? undefined : `502 body ${JSON.stringify(body)}`
  }
  if (response.status !== c.status) return `status ${response.status}, expected ${c.status} passed through`
  for (const [name] of HOSTILE) {
    if (response.headers.has(name)) return `${name} handed to the client`
  }
  // A body `fetch` decoded goes on without its coding; `identity` (no coding) may stay.
  const coding = response.headers.get('content-encoding')
  if (coding !== null && !(c.coding === 'identity' && coding === 'identity')) return `Content-Encoding ${coding} handed to the client`
  // HTTP drops the spaces around a field value.
  if (response.headers.get('x-app-custom') !== c.custom.trim()) return `x-app-custom ${response.headers.get('x-app-custom')}`
  let received: Uint8Array
  try {
    received = new Uint8Array(await response.arrayBuffer())
  } catch {
    // A stream cut after its head ends with an error: the status is already out.
    return c.cut === 'after-head' ? undefined : 'the body failed'
  }
  if (c.cut === 'after-head') return 'a cut stream read to its end'
  const expected = bodiless(c.status) ? new Uint8Array() : c.body
  return Buffer.from(received).equals(Buffer.from(expected)) ? undefined : `body of ${received.length} bytes, expected ${expected.length}`
}

describe('proxy handler against an upstream that answers at random', () => {
  const baseline = activeResources()
  let upstream: http.Server
  let cases: UpstreamCase[]
  const errors: string[] = []
  let proxy: ReturnType<typeof createProxyHandler>

  beforeAll(async () => {
    cases = fc.sample(caseArb, { seed: SEED, numRuns: CASES })
    upstream = upstreamApp(cases)
    await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve))
    const { port } = upstream.address() as { port: number }
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    proxy = createProxyHandler({
      upstream: { 'app_weather@1.0.0': `http://127.0.0.1:${port}/mcp` },
      identity: createIdentitySigner({ issuer: 'https://platform.test', privateKey }),
      forwardHeaders: ['x-fuzz-case'],
      timeoutMs: 2_000,
      onError: (error) => errors.push(String(error)),
    })
  })

  afterAll(async () => {
    upstream?.closeAllConnections()
    await new Promise((resolve) => upstream?.close(resolve))
  })

  it(`answers ${CASES} random upstream answers as documented: passed through without platform-only headers, or the JSON-RPC 502; never a 500, a throw or a hang (seed ${SEED})`, async () => {
    const failures: string[] = []
    let next = 0
    const worker = async () => {
      while (next < cases.length) {
        const index = next++
        const c = cases[index]!
        const request = new Request('http://weather.localhost/v1', {
          method: c.method,
          headers: { 'x-fuzz-case': String(index), 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
          ...(c.method === 'POST' && { body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}' }),
        })
        let timer: NodeJS.Timeout | undefined
        const deadline = new Promise<string>((resolve) => (timer = setTimeout(() => resolve('no answer within 10 s'), 10_000)))
        const answered = (async () => {
          let response: Response
          try {
            response = await proxy(request, context)
          } catch (error) {
            return `threw ${String(error)}`
          }
          const problem = await judge(c, response).catch((error: unknown) => `judging failed: ${String(error)}`)
          // A body left unread (a wrong answer) is let go, so its upstream connection ends.
          if (!response.bodyUsed) await response.body?.cancel().catch(() => {})
          return problem
        })()
        const problem = await Promise.race([answered, deadline])
        clearTimeout(timer)
        if (problem) failures.push(`case ${index} ${JSON.stringify({ ...c, body: c.body.length })}: ${problem}`)
      }
    }
    await Promise.all(Array.from({ length: CONCURRENCY }, worker))
    expect(failures.slice(0, 10), `${failures.length} wrong answers`).toEqual([])
    // Every refusal and cut stream was heard by onError; nothing else was.
    const heard = cases.filter((c) => refusedByProxy(c) || c.cut === 'after-head').length
    expect(errors.length).toBe(heard)
  })

  it('leaves no socket or timer behind once the upstream is gone', async () => {
    upstream.closeAllConnections()
    await new Promise((resolve) => upstream.close(resolve))
    expect(await leakedHandles(baseline)).toEqual({})
  })
})
