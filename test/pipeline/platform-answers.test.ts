/**
 * What the platform's own callbacks answer decides access only when it is the answer they are
 * documented to give: `true` or `false`, a subject that is a string. Anything else (a platform
 * written in plain JavaScript answering `'false'`, `1`, PostgreSQL's text `'f'`, a session of
 * another shape) is the platform's mistake: a 503 reported to `onError`, never a caller let in
 * and never a 400 blamed on the client. Found by an audit of misconfigurations: each case below
 * let the request through before.
 */
import {
  type AccessTokenResult,
  type AccessTokenValidator,
  StoreUnavailableError,
  type TokenService,
  createDispatcher,
  createMemoryAppStore,
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
    const refused = serve({ oauth: answering({ active: false, reason: 'expired' }) })
    expect((await refused.send('access-token')).status).toBe(401)
    expect([...accepted.errors, ...refused.errors]).toEqual([])
  })

  it('answering an active that is no boolean, or accepting a token without a subject, is a 503 reported to onError, the handler never reached (regression: active: \'false\' was a 200 as alice)', async () => {
    const cases: Array<[unknown, string]> = [
      [{ active: 'false', info: { subject: 'alice' } }, 'the OAuth validator answered active: string, not a boolean'],
      [{ active: 1, info: { subject: 'alice' } }, 'the OAuth validator answered active: 1, not a boolean'],
      [{ info: { subject: 'alice' } }, 'the OAuth validator answered active: undefined, not a boolean'],
      [undefined, 'the OAuth validator answered active: undefined, not a boolean'],
      [{ active: true, info: { subject: '' } }, 'the OAuth validator accepted a token whose info.subject is empty, not a non-empty string'],
      [{ active: true, info: { subject: 5 } }, 'the OAuth validator accepted a token whose info.subject is 5, not a non-empty string'],
      [{ active: true }, 'the OAuth validator accepted a token whose info.subject is undefined, not a non-empty string'],
    ]
    for (const [answer, message] of cases) {
      const { send, errors, reached } = serve({ oauth: answering(answer) })
      const answered = await send('access-token')
      expect(answered.status, JSON.stringify(answer)).toBe(503)
      expect(JSON.parse(answered.body).error.data).toMatchObject({ error: 'temporarily_unavailable' })
      expect(errors).toEqual([{ context: 'oauth failed', message: `mcp-dispatch: ${message}` }])
      expect(reached()).toBe(0)
    }
  })
})

describe('a token service of the platform\'s own', () => {
  it('answering an ok that is no boolean is a 503 reported to onError, never the record it names let in', async () => {
    for (const ok of ['false', 1, undefined]) {
      const { send, errors, reached, own } = serve({
        tokens: (service) => ({
          ...service,
          // A wrapper that turned the verdict into text, around the record of a live token.
          authenticate: async (token, clientAddress) => ({ ...(await service.authenticate(token, clientAddress)), ok }) as never,
        }),
      })
      const { token } = await own.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 7 })
      expect((await send(token)).status, String(ok)).toBe(503)
      expect(errors).toEqual([{ context: 'token failed', message: `mcp-dispatch: the token service's authenticate answered ok: ${ok === 1 ? '1' : typeof ok}, not a boolean` }])
      expect(reached()).toBe(0)
    }
  })
})

describe('createTokenService: canUseServer and the subscription store at creation', () => {
  it('an answer that is no boolean is StoreUnavailableError naming the subscription store, never a scope the user may not have (regression: \'false\' and \'f\' made a token for an App alice does not subscribe to)', async () => {
    const { apps, subscriptions } = stores()
    for (const answer of ['false', 'f', 1, null, Promise.resolve('no')]) {
      for (const options of [{ canUseServer: () => answer as never }, { subscriptions: { isActive: () => answer as never } }]) {
        const store = createMemoryTokenStore()
        const tokens = createTokenService({ store, apps, subscriptions, ...options })
        const creating = tokens.create({ userId: 'alice', name: 'ci', servers: ['app_notes'], expiresInDays: 7 })
        const error = await creating.then(() => undefined, (e: unknown) => e as StoreUnavailableError)
        expect(error).toBeInstanceOf(StoreUnavailableError)
        expect(error!.status).toBe(503)
        expect((error!.cause as Error).message).toMatch(/^mcp-dispatch: (canUseServer|the subscription store's isActive) answered (string|1|null), not a boolean$/)
        expect(await tokens.list('alice')).toEqual([])
      }
    }
    // A boolean decides as before.
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
    await expect(tokens.create({ userId: 'alice', name: 'ci', servers: ['app_notes'], expiresInDays: 7 })).rejects.toMatchObject({ status: 400 })
    await expect(tokens.create({ userId: 'alice', name: 'ci', servers: ['app_weather'], expiresInDays: 7 })).resolves.toMatchObject({ name: 'ci' })
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

  it('a write passes only on verifyCsrf answering true; false is a 403; another answer a 503 reported, the token still active (regression: \'false\' revoked it)', async () => {
    for (const csrf of ['false', 'x-csrf-token-value', 1, undefined]) {
      const { send, errors, tokens, made } = await api({ csrf })
      expect((await send('DELETE', `/${made.id}`)).status, String(csrf)).toBe(503)
      expect(errors).toEqual([{ context: 'token api', message: `mcp-dispatch: verifyCsrf answered ${csrf === 1 ? '1' : typeof csrf}, not a boolean` }])
      expect((await tokens.list('alice'))[0]).toMatchObject({ id: made.id, status: 'active' })
    }
    const refused = await api({ csrf: false })
    expect((await refused.send('DELETE', `/${refused.made.id}`)).status).toBe(403)
    const passed = await api({ csrf: true })
    expect((await passed.send('DELETE', `/${passed.made.id}`)).status).toBe(200)
    expect([...refused.errors, ...passed.errors]).toEqual([])
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
