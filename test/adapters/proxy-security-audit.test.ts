/**
 * Security review of the proxy handler and the identity header, against real servers on
 * 127.0.0.1: what a client can put in front of the upstream (a forged identity, client-address
 * claims, smuggled or traversing requests), what an upstream can send back to the client (its
 * copy of the identity token, version headers, huge or trickled heads), and what the App's
 * verifier makes of tokens built by hand (changed claims, algorithm confusion, malformed
 * headers and input).
 */
import * as http from 'node:http'
import * as net from 'node:net'
import { type JWK, SignJWT, exportJWK, generateKeyPair } from 'jose'
import { type DispatchContext, JwksUnavailableError, UnauthorizedError } from 'mcp-dispatch'
import { type IdentitySigner, createIdentitySigner, createIdentityVerifier, createProxyHandler } from 'mcp-dispatch/proxy'
import { afterAll, beforeAll, describe, expect, it } from 'vitest'
import { ADAPTER_KINDS, HOST, close, createFixture, listen, serveWebHandler } from './helpers.js'

const ISSUER = 'https://platform.test'
const APP_ORIGIN = 'http://app.internal'

const context: DispatchContext = {
  app: { id: 'app_weather', slug: 'weather', name: 'Weather' },
  identity: { subject: 'alice', method: 'oauth', clientId: 'client-1', scopes: ['openid'] },
  version: '2.0.0',
  latestVersion: '2.1.0',
  sessionId: undefined,
  baseUrl: 'http://weather.localhost',
  rateLimit: undefined,
}

/** What the upstream saw of one request. */
interface Seen {
  method: string | undefined
  url: string | undefined
  headers: http.IncomingHttpHeaders
  /** Raw header names and values, as they came: repeated fields stay repeated. */
  rawHeaders: string[]
  body: string
}

type Answer = (req: http.IncomingMessage, res: http.ServerResponse) => void

const OK: Answer = (_req, res) => void res.writeHead(200, { 'content-type': 'application/json' }).end('{"jsonrpc":"2.0","id":1,"result":{}}')

/** An upstream App that records each request and answers with `answer`. */
async function startUpstream() {
  const state = { origin: '', seen: [] as Seen[], answer: OK }
  const server = http.createServer(async (req, res) => {
    const chunks: Buffer[] = []
    for await (const chunk of req) chunks.push(chunk as Buffer)
    state.seen.push({ method: req.method, url: req.url, headers: req.headers, rawHeaders: req.rawHeaders, body: Buffer.concat(chunks).toString('utf8') })
    state.answer(req, res)
  })
  state.origin = `http://127.0.0.1:${await listen(server)}`
  return { state, close: () => close(server) }
}

/** Writes `bytes` to a loopback server as they are and reads until it closes (at most `ms`). */
function rawExchange(port: number, bytes: string, ms = 3000): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect(port, '127.0.0.1')
    let got = ''
    socket.setEncoding('latin1')
    socket.on('data', (chunk: string) => (got += chunk))
    socket.on('error', () => {})
    const timer = setTimeout(() => socket.destroy(), ms)
    socket.on('close', () => {
      clearTimeout(timer)
      resolve(got)
    })
    socket.write(bytes)
  })
}

/** The status codes of every response in a raw exchange. */
const statusesOf = (raw: string) => [...raw.matchAll(/^HTTP\/1\.1 (\d{3})/gm)].map((match) => Number(match[1]))

/** The header block of the first response of a raw exchange, names lower case. */
function headersOf(raw: string): Array<[string, string]> {
  const head = raw.slice(0, raw.indexOf('\r\n\r\n'))
  return head
    .split('\r\n')
    .slice(1)
    .map((line) => {
      const colon = line.indexOf(':')
      return [line.slice(0, colon).toLowerCase(), line.slice(colon + 1).trim()] as [string, string]
    })
}

const BODY = '{"jsonrpc":"2.0","id":1,"method":"tools/list"}'

describe('proxy security: what a client sends never reaches the upstream as its own', () => {
  let upstream: Awaited<ReturnType<typeof startUpstream>>
  let signer: IdentitySigner

  beforeAll(async () => {
    upstream = await startUpstream()
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    signer = createIdentitySigner({ issuer: ISSUER, privateKey })
  })
  afterAll(() => upstream.close())

  for (const kind of ADAPTER_KINDS) {
    it(`${kind}: a client's own identity header (any case, repeated, padded) and client-address claims are replaced or dropped: the upstream gets one identity, the platform's`, async () => {
      const fixture = createFixture()
      const handler = createProxyHandler({ upstream: { 'app_weather@2.0.0': `${upstream.state.origin}/mcp` }, identity: signer })
      const { port, close: stop } = await serveWebHandler(kind, fixture, handler)
      upstream.state.seen = []
      upstream.state.answer = OK
      try {
        // Forged in every spelling a parser might keep apart; `forged.*` would be refused by the
        // App's verifier, but it must not even get there, nor beside the platform's token.
        const raw = await rawExchange(
          port,
          `POST /v2 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\n` +
            'X-MCP-Identity: forged.one.x\r\nx-mcp-identity: forged.two.x\r\nX-Mcp-IDENTITY:   forged.three.x  \r\n' +
            'X-Forwarded-For: 203.0.113.66\r\nX-Forwarded-Host: evil.example\r\nX-Forwarded-Proto: https\r\nForwarded: for=203.0.113.66\r\n' +
            'X-Real-IP: 203.0.113.66\r\nTrue-Client-IP: 203.0.113.66\r\nCookie: session=abc\r\n' +
            `Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: ${BODY.length}\r\nConnection: close\r\n\r\n${BODY}`,
        )
        expect(statusesOf(raw)).toEqual([200])
        expect(upstream.state.seen).toHaveLength(1)
        const seen = upstream.state.seen[0]!
        const names = seen.rawHeaders.filter((_, i) => i % 2 === 0).map((name) => name.toLowerCase())
        expect(names.filter((name) => name === 'x-mcp-identity')).toHaveLength(1)
        for (const name of ['authorization', 'cookie', 'forwarded', 'x-real-ip', 'true-client-ip']) expect(names, name).not.toContain(name)
        expect(names.filter((name) => name.startsWith('x-forwarded-'))).toEqual([])
        expect(seen.headers['x-mcp-identity']).not.toContain('forged')
        const verify = createIdentityVerifier({ jwks: await signer.jwks(), issuer: ISSUER, audience: upstream.state.origin, appId: 'app_weather' })
        expect(await verify({ headers: seen.headers })).toMatchObject({ subject: 'alice', appId: 'app_weather', version: '2.0.0', method: 'api_token' })
      } finally {
        await stop()
      }
    })

    it(`${kind}: smuggling (Content-Length with Transfer-Encoding, two Content-Lengths, obs-fold) and traversal (../, %2F) are refused before the upstream, never a 500`, async () => {
      const fixture = createFixture()
      const handler = createProxyHandler({ upstream: { 'app_weather@2.0.0': `${upstream.state.origin}/mcp` }, identity: signer })
      const { port, close: stop } = await serveWebHandler(kind, fixture, handler)
      const auth = `Host: ${HOST}\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\n`
      const cases: Record<string, string> = {
        'CL.TE': `POST /v2 HTTP/1.1\r\n${auth}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /v1 HTTP/1.1\r\n${auth}\r\n`,
        'two Content-Lengths': `POST /v2 HTTP/1.1\r\n${auth}Content-Length: 2\r\nContent-Length: 40\r\n\r\n{}`,
        'Transfer-Encoding with a space before its colon': `POST /v2 HTTP/1.1\r\n${auth}Transfer-Encoding : chunked\r\nContent-Length: 2\r\n\r\n{}`,
        'obs-fold of the identity header': `POST /v2 HTTP/1.1\r\n${auth}X-MCP-Identity: a\r\n b\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
        '../ to another version': `POST /v2/../v1 HTTP/1.1\r\n${auth}Content-Length: 2\r\nConnection: close\r\n\r\n{}`,
        'encoded slashes to another version': `POST /v2%2F..%2Fv1 HTTP/1.1\r\n${auth}Content-Length: 2\r\nConnection: close\r\n\r\n{}`,
        'encoded dots': `POST /v2/%2e%2e/v1 HTTP/1.1\r\n${auth}Content-Length: 2\r\nConnection: close\r\n\r\n{}`,
      }
      try {
        for (const [name, bytes] of Object.entries(cases)) {
          upstream.state.seen = []
          const statuses = statusesOf(await rawExchange(port, bytes))
          expect(statuses.length, name).toBeGreaterThan(0)
          for (const status of statuses) expect([400, 404], name).toContain(status)
          expect(upstream.state.seen, name).toEqual([])
        }
      } finally {
        await stop()
      }
    })

    it(`${kind}: the upstream's version headers never replace the dispatch layer's`, async () => {
      const fixture = createFixture()
      const handler = createProxyHandler({ upstream: { 'app_weather@2.0.0': `${upstream.state.origin}/mcp` }, identity: signer })
      const { port, close: stop } = await serveWebHandler(kind, fixture, handler)
      upstream.state.answer = (_req, res) =>
        void res.writeHead(200, { 'content-type': 'application/json', 'x-mcp-version': '9.9.9', 'x-mcp-latest-version': '9.9.9' }).end('{}')
      try {
        const raw = await rawExchange(
          port,
          `POST /v2 HTTP/1.1\r\nHost: ${HOST}\r\nAuthorization: Bearer ${fixture.tokens.alice}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}`,
        )
        expect(statusesOf(raw)).toEqual([200])
        const headers = headersOf(raw)
        expect(headers.filter(([name]) => name === 'x-mcp-version')).toEqual([['x-mcp-version', '2.0.0']])
        expect(headers.filter(([name]) => name === 'x-mcp-latest-version')).toEqual([['x-mcp-latest-version', '2.0.0']])
      } finally {
        upstream.state.answer = OK
        await stop()
      }
    })
  }
})

describe('proxy security: what an upstream sends back', () => {
  let upstream: Awaited<ReturnType<typeof startUpstream>>
  let signer: IdentitySigner
  const errors: unknown[] = []

  beforeAll(async () => {
    upstream = await startUpstream()
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    signer = createIdentitySigner({ issuer: ISSUER, privateKey })
  })
  afterAll(() => upstream.close())

  const post = () => new Request('http://weather.localhost/v2', { method: 'POST', headers: { 'content-type': 'application/json' }, body: BODY })

  it('an upstream that echoes the identity token back: the client never gets it, under the default header or its own name (regression: relayed as it came)', async () => {
    // An App that mirrors request headers (a debug middleware, a framework's echo) would hand
    // the caller a token signed by the platform, good for ttlSeconds at that App's address.
    upstream.state.answer = (req, res) => {
      const echoed: Record<string, string> = { 'content-type': 'application/json' }
      for (const name of ['x-mcp-identity', 'x-platform-identity']) {
        const value = req.headers[name]
        if (typeof value === 'string') echoed[name] = value
      }
      res.writeHead(200, { ...echoed, 'x-app': 'yes' }).end('{}')
    }
    try {
      for (const identityHeader of [undefined, 'X-Platform-Identity']) {
        const handler = createProxyHandler({ upstream: { 'app_weather@2.0.0': `${upstream.state.origin}/mcp` }, identity: signer, identityHeader })
        upstream.state.seen = []
        const response = await handler(post(), context)
        expect(response.status).toBe(200)
        expect(await response.text()).toBe('{}')
        const name = (identityHeader ?? 'x-mcp-identity').toLowerCase()
        // The upstream did get it, and did send it back.
        expect(typeof upstream.state.seen[0]!.headers[name]).toBe('string')
        expect(response.headers.get(name), name).toBeNull()
        expect(response.headers.get('x-app')).toBe('yes')
      }
    } finally {
      upstream.state.answer = OK
    }
  })

  it('a head larger than the client could be sent is a 502 upstream_unavailable, reported; a head trickled a byte at a time is a 504 at timeoutMs', async () => {
    const handler = createProxyHandler({
      upstream: { 'app_weather@2.0.0': `${upstream.state.origin}/mcp` },
      identity: signer,
      timeoutMs: 400,
      onError: (error) => errors.push(error),
    })
    upstream.state.answer = (_req, res) => void res.writeHead(200, { 'content-type': 'application/json', 'x-big': 'a'.repeat(100_000) }).end('{}')
    try {
      const huge = await handler(post(), context)
      expect(huge.status).toBe(502)
      expect(await huge.json()).toMatchObject({ error: { data: { error: 'upstream_unavailable' } } })
      expect(errors).toHaveLength(1)
    } finally {
      upstream.state.answer = OK
    }

    // A head sent one byte every 50 ms: each byte is progress to the socket, none to the proxy.
    const sockets = new Set<net.Socket>()
    const trickler = net.createServer((socket) => {
      sockets.add(socket)
      socket.on('error', () => {})
      socket.once('data', () => {
        const head = 'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}'
        let i = 0
        const timer = setInterval(() => {
          if (socket.destroyed || i >= head.length) clearInterval(timer)
          else socket.write(head[i++]!)
        }, 50)
      })
    })
    await new Promise<void>((resolve) => trickler.listen(0, '127.0.0.1', () => resolve()))
    try {
      const slow = createProxyHandler({
        upstream: { 'app_weather@2.0.0': `http://127.0.0.1:${(trickler.address() as net.AddressInfo).port}/mcp` },
        identity: signer,
        timeoutMs: 400,
        onError: () => {},
      })
      const started = performance.now()
      const response = await slow(post(), context)
      expect(response.status).toBe(504)
      expect(await response.json()).toMatchObject({ error: { data: { error: 'upstream_timeout' } } })
      // Far less than the head's own 4 s: the deadline is the proxy's.
      expect(performance.now() - started).toBeLessThan(2_000)
    } finally {
      for (const socket of sockets) socket.destroy()
      await new Promise((resolve) => trickler.close(resolve))
    }
  })
})

describe('identity verifier: tokens built by hand', () => {
  const at = Date.UTC(2030, 0, 1)
  let privateJwk: JWK
  let signer: IdentitySigner
  let kid: string

  beforeAll(async () => {
    const { privateKey } = await generateKeyPair('ES256', { extractable: true })
    privateJwk = await exportJWK(privateKey)
    signer = createIdentitySigner({ issuer: ISSUER, privateKey: privateJwk, now: () => at })
    kid = (await signer.jwks()).keys[0]!.kid!
  })

  const b64 = (value: unknown) => Buffer.from(JSON.stringify(value)).toString('base64url')
  const verifierOf = async () =>
    createIdentityVerifier({ jwks: await signer.jwks(), issuer: ISSUER, audience: APP_ORIGIN, appId: 'app_weather', now: () => at })

  it('the signature covers every claim: a token with its app, ver, sub, method, aud, iss, iat or exp changed is refused (401)', async () => {
    const verify = await verifierOf()
    const token = await signer.sign(context, APP_ORIGIN)
    await expect(verify(token)).resolves.toMatchObject({ subject: 'alice', version: '2.0.0' })
    const [header, payload, signature] = token.split('.') as [string, string, string]
    const claims = JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as Record<string, unknown>
    const changes: Record<string, unknown> = {
      app: 'app_weather ',
      ver: '1.0.0',
      sub: 'bob',
      method: 'api_token',
      aud: APP_ORIGIN,
      iss: ISSUER,
      iat: (claims.iat as number) - 1,
      exp: (claims.exp as number) + 1,
      jti: 'replayed',
      scope: 'openid admin',
    }
    for (const [claim, value] of Object.entries(changes)) {
      // `aud` and `iss` unchanged in value but re-encoded as a list / with a key order changed:
      // any byte of the payload other than the signed one fails.
      const changed = claim === 'aud' ? { ...claims, aud: [APP_ORIGIN] } : claim === 'iss' ? { iss: value, ...claims } : { ...claims, [claim]: value }
      await expect(verify(`${header}.${b64(changed)}.${signature}`), claim).rejects.toBeInstanceOf(UnauthorizedError)
    }
  })

  it('algorithm confusion: alg none, HS256 keyed with the public key, or another asymmetric alg under the kid, is refused (401)', async () => {
    const verify = await verifierOf()
    const claims = { iss: ISSUER, sub: 'alice', aud: APP_ORIGIN, iat: at / 1000, exp: at / 1000 + 60, jti: 'j', app: 'app_weather', ver: '2.0.0', method: 'oauth' }
    const publicJwk = (await signer.jwks()).keys[0]!
    const typ = 'mcp-identity+jwt'
    const forged = [
      `${b64({ alg: 'none', typ, kid })}.${b64(claims)}.`,
      // HMAC keyed with what an attacker has: the public key's members, or the JWKS document.
      await new SignJWT(claims).setProtectedHeader({ alg: 'HS256', typ, kid }).sign(new TextEncoder().encode(JSON.stringify(publicJwk))),
      await new SignJWT(claims).setProtectedHeader({ alg: 'HS256', typ, kid }).sign(Buffer.from(publicJwk.x!, 'base64url')),
      // A key of the attacker's own, under the platform key's kid.
      await new SignJWT(claims).setProtectedHeader({ alg: 'ES384', typ, kid }).sign((await generateKeyPair('ES384')).privateKey),
      // The right key, a header naming another key type for it.
      `${b64({ alg: 'EdDSA', typ, kid })}.${b64(claims)}.${(await signer.sign(context, APP_ORIGIN)).split('.')[2]}`,
    ]
    for (const token of forged) await expect(verify(token), token.slice(0, 60)).rejects.toBeInstanceOf(UnauthorizedError)
  })

  it('malformed input, huge input and repeated headers are a 401 (UnauthorizedError) whose message holds nothing of the keys', async () => {
    const verify = await verifierOf()
    const jwks = await signer.jwks()
    const secrets = [privateJwk.d!, privateJwk.x!, jwks.keys[0]!.x!]
    const token = await signer.sign(context, APP_ORIGIN)
    const inputs: Parameters<typeof verify>[0][] = [
      '',
      '.',
      '..',
      'a.b.c',
      'é.ü.ß',
      `${token}.extra`,
      `${token} ${token}`,
      'x'.repeat(4 * 1024 * 1024),
      `${'a'.repeat(1024 * 1024)}.${'b'.repeat(1024 * 1024)}.${'c'.repeat(1024 * 1024)}`,
      `${b64({ alg: 'ES256', typ: 'mcp-identity+jwt', kid: 'k'.repeat(100_000) })}.${token.split('.')[1]}.${token.split('.')[2]}`,
      new Headers([['x-mcp-identity', token], ['X-MCP-Identity', token]]),
      new Request('http://app.internal/mcp', { headers: { 'x-mcp-identity': 'not a token' } }),
      // Node joins a repeated header: two tokens, each valid alone, are no token.
      { headers: { 'x-mcp-identity': `${token}, ${token}` } },
      { headers: { 'x-mcp-identity': [token, token] } },
      { headers: {} },
      null,
    ]
    for (const input of inputs) {
      const error = await verify(input).then(
        () => undefined,
        (refusal: unknown) => refusal,
      )
      expect(error, String(input).slice(0, 40)).toBeInstanceOf(UnauthorizedError)
      const said = `${(error as Error).message} ${JSON.stringify(error)}`
      for (const secret of secrets) expect(said).not.toContain(secret)
    }
  })

  it('a token whose kid is not a string or is empty, or whose payload is unencoded (b64: false), is a 401 from a JWKS URL too, never the 503 of a key not yet published (regression: JwksUnavailableError)', async () => {
    const jwks = await signer.jwks()
    let fetches = 0
    const server = http.createServer((_req, res) => {
      fetches++
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(jwks))
    })
    const port = await listen(server)
    try {
      const verify = createIdentityVerifier({ jwks: `http://127.0.0.1:${port}/jwks.json`, issuer: ISSUER, audience: APP_ORIGIN, appId: 'app_weather', now: () => at })
      const good = await signer.sign(context, APP_ORIGIN)
      await expect(verify(good)).resolves.toMatchObject({ subject: 'alice' })
      expect(fetches).toBe(1)
      const [, payload, signature] = good.split('.') as [string, string, string]
      // Claims that all pass, issued now: only the header is wrong. No key, fetched or to come,
      // has a kid that is not a string (RFC 7515 section 4.1.4) or an empty one (the signer
      // refuses it), and no JWT has an unencoded payload (RFC 7797 section 7): no retry can help.
      const headers: unknown[] = [
        ...[5, { kid }, [kid], true, null, ''].map((badKid) => ({ alg: 'ES256', typ: 'mcp-identity+jwt', kid: badKid })),
        { alg: 'ES256', typ: 'mcp-identity+jwt', kid: 'a-key-published-later', b64: false, crit: ['b64'] },
      ]
      for (const header of headers) {
        const error = await verify(`${b64(header)}.${payload}.${signature}`).then(
          () => undefined,
          (refusal: unknown) => refusal,
        )
        expect(error, JSON.stringify(header)).not.toBeInstanceOf(JwksUnavailableError)
        expect(error, JSON.stringify(header)).toBeInstanceOf(UnauthorizedError)
      }
      // Not fetched again for them (the clock given stands still: within the 30 s cooldown).
      expect(fetches).toBe(1)
    } finally {
      await close(server)
    }
  })
})
