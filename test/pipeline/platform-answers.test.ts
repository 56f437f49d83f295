/**
 * What the platform's own callbacks answer lets a caller in only when it is the answer they are
 * documented to give: `true`, a subject that is a string. Any other answer refuses, as `false`
 * does, and one that is not of the documented type (a platform written in plain JavaScript
 * answering `'false'`, `1`, PostgreSQL's text `'f'`) is reported to `onError` too; a session of
 * another shape is the platform's mistake, a 503 reported, never a 400 blamed on the client.
 * Found by audits of misconfigurations: each `'false'` below let the request through before.
 */
import {
  type AccessTokenResult,
  type AccessTokenValidator,
  StoreUnavailableError,
  type TokenStore,
  type TokenService,
  createDispatcher,
  createMemoryAppStore,
  createMemoryInvalidationBus,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenApi,
  createTokenService,
} from 'mcp-dispatch'
import { mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'

const APPS = [
  { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] },
  { id: 'app_notes', slug: 'notes', name: 'Notes', versions: ['1.0.0'] },
]

function stores() {
  const apps = createMemoryAppStore(APPS)
  const subscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
  const errors: Array<{ context: string; message: string }> = []
  const onError = (error: unknown, context: string) => errors.push({ context, message: (error as Error).message })
  return { apps, subscriptions, errors, onError }
}

/** The weather App through the Web adapter, with `oauth` and `tokens` as given; `send` posts tools/list with `token`. */
function serve(options: { oauth?: AccessTokenValidator; tokens?: (own: TokenService) => TokenService } = {}) {
  const { apps, subscriptions, errors, onError } = stores()
  const own = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
  let reached = 0
  const fetch = mcpDispatch({
    dispatcher: createDispatcher({
      apps,
      subscriptions,
      tokens: options.tokens?.(own) ?? own,
      ...(options.oauth && { oauth: options.oauth, authorizationServers: ['https://auth.example.com'] }),
      onError,
    }),
    handler: () => {
      reached++
      return Response.json({ jsonrpc: '2.0', id: 1, result: { tools: [] } })
    },
  })
  const send = async (token: string) => {
    const response = await fetch(
      new Request('http://weather.localhost/v1', {
        method: 'POST',
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
        body: '{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
      }),
    )
    return { status: response.status, body: await response.text() }
  }
  return { send, errors, reached: () => reached, own }
}

describe('an OAuth validator of the platform\'s own', () => {
  const answering = (answer: unknown): AccessTokenValidator => ({ validate: async () => answer as AccessTokenResult })

  it('lets a caller in only on active: true with a subject; active: false is a 401', async () => {
    const accepted = serve({ oauth: answering({ active: true, info: { subject: 'alice' } }) })
    expect((await accepted.send('access-token')).status).toBe(200)
    // `null` for the fields that grant nothing is absent (`clientId: claims.azp ?? null`), not a
    // refusal of every user.
    const nulls = serve({ oauth: answering({ active: true, info: { subject: 'alice', clientId: null, scopes: null } }) })
    expect((await nulls.send('access-token')).status).toBe(200)
    expect(nulls.errors).toEqual([])
    const refused = serve({ oauth: answering({ active: false, reason: 'expired' }) })
    expect((await refused.send('access-token')).status).toBe(401)
    expect([...accepted.errors, ...refused.errors]).toEqual([])
  })

  it('any other answer refuses (401) and is reported, the handler never reached (regression: active: \'false\' was a 200 as alice)', async () => {
    const cases: Array<[unknown, string]> = [
      [{ active: 'false', info: { subject: 'alice' } }, 'answered active: string, not a boolean'],
      [{ active: 1, info: { subject: 'alice' } }, 'answered active: 1, not a boolean'],
      [{ active: 0, info: { subject: 'alice' } }, 'answered active: 0, not a boolean'],
      [{ info: { subject: 'alice' } }, 'answered active: undefined, not a boolean'],
      [undefined, 'answered active: undefined, not a boolean'],
      [{ active: true, info: { subject: '' } }, 'accepted a token whose info.subject is empty, not a non-empty string'],
      [{ active: true, info: { subject: 5 } }, 'accepted a token whose info.subject is 5, not a non-empty string'],
      [{ active: true }, 'accepted a token whose info.subject is undefined, not a non-empty string'],
      [{ active: true, info: { subject: 'alice', clientId: 7 } }, 'accepted a token whose info.clientId is 7, not a string'],
      [{ active: true, info: { subject: 'alice', scopes: 'openid mcp' } }, 'accepted a token whose info.scopes are string, not an array of strings (split a space-separated scope claim)'],
      // A hole is no scope (`every` skips holes: it passed, and the App got [null, 'a']).
      // eslint-disable-next-line no-sparse-arrays
      [{ active: true, info: { subject: 'alice', scopes: [, 'a'] } }, 'accepted a token whose info.scopes are array, not an array of strings (split a space-separated scope claim)'],
    ]
    for (const [answer, problem] of cases) {
      const { send, errors, reached } = serve({ oauth: answering(answer) })
      const answered = await send('access-token')
      expect(answered.status, JSON.stringify(answer)).toBe(401)
      expect(JSON.parse(answered.body).error.code).toBe(-32001)
      expect(errors).toEqual([{ context: 'oauth answer', message: `mcp-dispatch: the OAuth validator ${problem}: refused (401)` }])
      expect(reached()).toBe(0)
    }
  })
})

describe('a token service of the platform\'s own', () => {
  it('answering an ok that is no boolean refuses (401) and is reported, never the record it names let in', async () => {
    for (const ok of ['false', 1, 0, undefined]) {
      const { send, errors, reached, own } = serve({
        tokens: (service) => ({
          ...service,
          // A wrapper that turned the verdict into text, around the record of a live token.
          authenticate: async (token, clientAddress) => ({ ...(await service.authenticate(token, clientAddress)), ok }) as never,
        }),
      })
      const { token } = await own.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 7 })
      expect((await send(token)).status, String(ok)).toBe(401)
      expect(errors).toEqual([{ context: 'token answer', message: `mcp-dispatch: the token service's authenticate answered ok: ${typeof ok === 'number' ? ok : typeof ok}, not a boolean: refused (401)` }])
      expect(reached()).toBe(0)
    }
  })

  it('accepting a token whose record has no string owner, or a scope that is no array, is a 503 reported, never a caller of no one or of every App', async () => {
    const cases: Array<[Record<string, unknown>, string]> = [
      [{ userId: undefined }, 'userId is undefined, not a non-empty string'],
      [{ userId: '' }, 'userId is empty, not a non-empty string'],
      [{ userId: 42 }, 'userId is 42, not a non-empty string'],
      // JSON text of a scope: a string's includes would match app_weather inside app_weather_admin.
      [{ servers: '["app_weather_admin"]' }, 'servers is string, not an array of App ids'],
    ]
    for (const [patch, problem] of cases) {
      const { send, errors, reached, own } = serve({
        tokens: (service) => ({
          ...service,
          authenticate: async (token, clientAddress) => {
            const auth = await service.authenticate(token, clientAddress)
            return (auth.ok ? { ...auth, record: { ...auth.record, ...patch } } : auth) as never
          },
        }),
      })
      const { token } = await own.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 7 })
      expect((await send(token)).status, JSON.stringify(patch)).toBe(503)
      expect(errors).toEqual([{ context: 'token failed', message: `mcp-dispatch: the token service accepted a token whose record's ${problem}` }])
      expect(reached()).toBe(0)
    }
  })
})

describe('createTokenService: canUseServer and the subscription store at creation', () => {
  it('only true puts an App in the scope; an answer that is no boolean refuses it as false does, and is reported (regression: \'false\' and \'f\' made a token for an App alice does not subscribe to)', async () => {
    const { apps, subscriptions, errors, onError } = stores()
    for (const answer of ['false', 'f', 1, null, Promise.resolve('no')]) {
      for (const options of [{ canUseServer: () => answer as never }, { subscriptions: { isActive: () => answer as never } }]) {
        errors.length = 0
        const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions, onError, ...options })
        await expect(tokens.create({ userId: 'alice', name: 'ci', servers: ['app_notes'], expiresInDays: 7 })).rejects.toMatchObject({ status: 400, field: 'servers.0' })
        expect(errors).toEqual([
          {
            context: 'subscriptions answer',
            message: expect.stringMatching(/^mcp-dispatch: (canUseServer|the subscription store's isActive) answered (string|1|null), not a boolean: the App refused for the new token$/),
          },
        ])
        expect(await tokens.list('alice')).toEqual([])
      }
    }
    // A boolean decides as before, unreported.
    errors.length = 0
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions, onError })
    await expect(tokens.create({ userId: 'alice', name: 'ci', servers: ['app_notes'], expiresInDays: 7 })).rejects.toMatchObject({ status: 400 })
    await expect(tokens.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 7 })).resolves.toMatchObject({ name: 'ci' })
    expect(errors).toEqual([])
  })
})

describe('createTokenApi: authenticateSession and verifyCsrf', () => {
  async function api(options: { session?: unknown; csrf?: unknown }) {
    const { apps, subscriptions, errors, onError } = stores()
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
    const made = await tokens.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 7 })
    const handle = createTokenApi({
      tokens,
      authenticateSession: () => ('session' in options ? options.session : { userId: 'alice' }) as never,
      verifyCsrf: () => ('csrf' in options ? options.csrf : true) as never,
      onError,
    })
    const send = async (method: string, path = '') => {
      const response = (await handle(new Request(`http://dashboard.localhost/api/tokens${path}`, { method })))!
      return { status: response.status, body: await response.text() }
    }
    return { send, errors, tokens, made }
  }

  it('a write passes only on verifyCsrf answering true; any other answer is a 403, a truthy one reported, the token still active (regression: \'false\' revoked it)', async () => {
    for (const csrf of ['false', 'x-csrf-token-value', 1, {}]) {
      const { send, errors, tokens, made } = await api({ csrf })
      expect((await send('DELETE', `/${made.id}`)).status, String(csrf)).toBe(403)
      expect(errors).toEqual([{ context: 'token api', message: `mcp-dispatch: verifyCsrf answered ${csrf === 1 ? '1' : typeof csrf}, not a boolean: refused (403)` }])
      expect((await tokens.list('alice'))[0]).toMatchObject({ id: made.id, status: 'active' })
    }
    // What `header && header === expected` answers a forged request without the header: a
    // 403, not reported (every forged request would be a line).
    for (const csrf of [false, null, undefined, '', 0]) {
      const { send, errors, tokens, made } = await api({ csrf })
      expect((await send('DELETE', `/${made.id}`)).status, String(csrf)).toBe(403)
      expect(errors).toEqual([])
      expect((await tokens.list('alice'))[0]).toMatchObject({ id: made.id, status: 'active' })
    }
    const passed = await api({ csrf: true })
    expect((await passed.send('DELETE', `/${passed.made.id}`)).status).toBe(200)
    expect(passed.errors).toEqual([])
  })

  it('a session whose userId is no non-empty string is a 503 reported, not a 400 blamed on the client; no session is a 401', async () => {
    for (const [session, named] of [['alice', 'undefined'], [{ id: 'alice' }, 'undefined'], [{ userId: '' }, 'empty'], [{ userId: 7 }, '7']] as const) {
      const { send, errors } = await api({ session })
      expect((await send('GET')).status, JSON.stringify(session)).toBe(503)
      expect(errors).toEqual([{ context: 'token api', message: `mcp-dispatch: authenticateSession answered a session whose userId is ${named}, not a non-empty string` }])
    }
    for (const session of [null, undefined, false]) {
      const { send, errors } = await api({ session })
      expect((await send('GET')).status).toBe(401)
      expect(errors).toEqual([])
    }
  })
})

describe('a token store of the platform\'s own answering a write as its driver does', () => {
  /** Alice's token, cached by a token service over `store` (10 minutes, a bus to invalidate on), seen live once. */
  async function cachedToken(answer: { revoke?: unknown; revokeAllForUser?: unknown }, options: { storeTimeoutMs?: number } = {}) {
    const { apps, subscriptions, errors, onError } = stores()
    const raw = createMemoryTokenStore()
    const store: TokenStore = {
      ...raw,
      // The rows are written; the answer is what an UPDATE's driver gives (`true`, a row count).
      revoke: (id, at) => (raw.revoke(id, at), answer.revoke as never),
      revokeAllForUser: (userId, at) => (raw.revokeAllForUser(userId, at), answer.revokeAllForUser as never),
    }
    const tokens = createTokenService({ store, apps, subscriptions, cacheTtlMs: 600_000, invalidations: createMemoryInvalidationBus(), onError, ...options })
    const made = await tokens.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 7 })
    expect((tokens.authenticate(made.token) as { ok: boolean }).ok).toBe(true)
    return { tokens, made, raw, errors }
  }

  it('a revocation whose store answers true past its deadline (its caller told 503) ends the cached token when the answer lands', async () => {
    let land!: () => void
    const landed = new Promise<void>((resolve) => (land = resolve))
    // The row is written at once; the driver's answer comes after the deadline.
    const late = { then: (resolve: (value: unknown) => void) => void setTimeout(() => (resolve(true), land()), 150) }
    const { tokens, made, errors } = await cachedToken({ revoke: late }, { storeTimeoutMs: 50 })
    await expect(tokens.revoke('alice', made.id)).rejects.toBeInstanceOf(StoreUnavailableError)
    await landed
    await expect.poll(() => (tokens.authenticate(made.token) as { ok: boolean }).ok).toBe(false)
    expect(errors).toEqual([])
  })

  it('a password reset whose store answers no array still ends every cached token of the user, and tells the platform the store is wrong (regression: a TypeError, nothing invalidated, the token served from the cache)', async () => {
    for (const answer of [1, true]) {
      const { tokens, made } = await cachedToken({ revokeAllForUser: answer })
      const resetting = tokens.revokeAllForUser('alice')
      await expect(resetting).rejects.toBeInstanceOf(StoreUnavailableError)
      await expect(resetting).rejects.toMatchObject({ cause: { message: `mcp-dispatch: the token store's revokeAllForUser answered ${answer === 1 ? '1' : 'boolean'}, not the array of the records it revoked` } })
      expect(tokens.authenticate(made.token)).toMatchObject({ ok: false })
    }
  })

  it('a revocation whose store answers no record ends the cached token and is a 503 naming the store (regression: "Invalid time value")', async () => {
    for (const answer of [1, true]) {
      const { tokens, made } = await cachedToken({ revoke: answer })
      const revoking = tokens.revoke('alice', made.id)
      await expect(revoking).rejects.toMatchObject({ status: 503, cause: { message: `mcp-dispatch: the token store's revoke answered ${answer === 1 ? '1' : 'boolean'}, not the revoked record, or undefined` } })
      expect(await Promise.resolve(tokens.authenticate(made.token))).toMatchObject({ ok: false })
    }
  })
})

describe('a rate-limit store of the platform\'s own answering its count as a driver does', () => {
  it('a bigint or a decimal string is the count it names: the limit holds (regression: served without a count, every request)', async () => {
    const answers = [(n: number) => BigInt(n), (n: number) => String(n), (n: number, windowStart: number) => ({ count: String(n), windowStart: String(windowStart) })]
    for (const as of answers) {
      const { apps, subscriptions, errors, onError } = stores()
      const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
      const { token } = await tokens.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 7 })
      const counts = new Map<string, number>()
      const fetch = mcpDispatch({
        dispatcher: createDispatcher({
          apps,
          subscriptions,
          tokens,
          onError,
          rateLimit: {
            store: {
              increment: (key, windowStart) => {
                const count = (counts.get(key) ?? 0) + 1
                counts.set(key, count)
                return as(count, windowStart) as never
              },
            },
            policy: () => ({ limit: 2, windowType: 'minute' }),
          },
        }),
        handler: () => Response.json({ jsonrpc: '2.0', id: 1, result: {} }),
      })
      const statuses: number[] = []
      for (let i = 0; i < 4; i++) {
        const response = await fetch(new Request('http://weather.localhost/v1', { method: 'POST', headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' }, body: '{}' }))
        statuses.push(response.status)
      }
      expect(statuses).toEqual([200, 200, 429, 429])
      expect(errors).toEqual([])
    }
  })
})
