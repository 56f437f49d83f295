/**
 * Which pins a request's version path accepts (DESIGN.md "Versions": a session keeps its
 * version, an exact URL never resolves to another, a pre-release only by its exact URL), for
 * any version string a session store may hand back: the rule as first written, with
 * `split('.', 2).map(Number)`, is the reference, and a pin whose version is not a semantic
 * version as written (it would go into `X-MCP-Version`) is never accepted.
 */
import fc from 'fast-check'
import {
  type SessionPin,
  type SessionStore,
  createDispatcher,
  createMemoryAppStore,
  createMemorySubscriptionStore,
  createMemoryTokenStore,
  createTokenService,
  parseVersionPath,
} from 'mcp-dispatch'
import { describe, expect, it } from 'vitest'
import { isExactVersion, isPreRelease } from '../../src/core/versions.js'
import { dispatchRequest } from '../helpers/dispatch-request.js'

const APP = { id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0', '1.2.3', '2.0.0'] }
const USER = 'user_1'

/** The reference: the rule as it was written before the allocation-free one. */
function referenceMatches(version: string, path: string): boolean {
  if (!isExactVersion(version)) return false
  const selector = parseVersionPath(path)!
  switch (selector.kind) {
    case 'exact':
      return version === selector.version
    case 'latest':
      return !isPreRelease(version)
    default: {
      if (isPreRelease(version)) return false
      const [major, minor] = version.split('.', 2).map(Number)
      return major === selector.major && (selector.kind === 'major' || minor === selector.minor)
    }
  }
}

describe('a session pin against the version path of a request', () => {
  it('is accepted exactly when the reference rule accepts it, whatever the pinned version string', async () => {
    const apps = createMemoryAppStore([APP])
    const subscriptions = createMemorySubscriptionStore([{ userId: USER, appId: APP.id, active: true }])
    const tokens = createTokenService({ store: createMemoryTokenStore(), apps, subscriptions })
    const { token } = await tokens.create({ userId: USER, name: 't', servers: [APP.id], expiresInDays: 30 })
    let pinned = ''
    const sessions: SessionStore = {
      synchronous: true,
      get: (): SessionPin => ({ appId: APP.id, version: pinned, subject: USER }),
      set: () => true,
      delete: () => undefined,
    }
    // A pin refused for its form is reported; the reports are counted, not printed.
    let reported = 0
    const dispatcher = createDispatcher({ apps, subscriptions, tokens, sessions, onError: () => void reported++ })
    const request = (path: string) => dispatchRequest(path, { authorization: `Bearer ${token}`, 'mcp-session-id': 'session-1' })
    const part = fc.oneof(fc.nat({ max: 12 }).map(String), fc.constantFrom('', '0', '01', '1e0', '0x1', ' 1', '1 ', 'x', '-rc.1', '+b', '-', '+'))
    const version = fc.oneof(
      fc.array(part, { minLength: 1, maxLength: 4 }).map((parts) => parts.join('.')),
      fc.tuple(part, part, part, fc.constantFrom('', '-rc.1', '+build', '+b-1', '-a+b')).map(([a, b, c, d]) => `${a}.${b}.${c}${d}`),
      fc.string({ unit: fc.constantFrom('0', '1', '2', '.', '-', '+', ' ', 'e', 'x'), maxLength: 8 }),
    )
    const path = fc.oneof(
      fc.constant('/'),
      fc.nat({ max: 12 }).map((m) => `/v${m}`),
      fc.tuple(fc.nat({ max: 12 }), fc.nat({ max: 12 })).map(([m, n]) => `/v${m}.${n}`),
      fc.tuple(fc.nat({ max: 3 }), fc.nat({ max: 3 }), fc.nat({ max: 3 })).map(([m, n, p]) => `/v${m}.${n}.${p}`),
    )
    fc.assert(
      fc.property(version, path, (v, p) => {
        pinned = v
        const before = reported
        const decision = dispatcher.decide(request(p))
        // Only a pin that is not a version is reported (the others are plain 404s or served).
        if (isExactVersion(v)) expect(reported).toBe(before)
        if (decision instanceof Promise) throw new Error('expected a synchronous decision')
        if (referenceMatches(v, p)) {
          expect(decision.type).toBe('dispatch')
          if (decision.type === 'dispatch') expect(decision.context.version).toBe(v)
        } else {
          expect(decision.type === 'reply' && decision.reply.status).toBe(404)
        }
      }),
      { numRuns: 3000 },
    )
    // The cases the rule exists for, named.
    for (const [v, p, accepted] of [
      ['1.2.3', '/v1', true],
      ['1.2.3', '/v1.2', true],
      ['1.2.3', '/v1.3', false],
      ['1.2.3', '/v2', false],
      ['1.2.3-rc.1', '/v1', false],
      ['1.2.3-rc.1', '/', false],
      ['1.2.4', '/v1.2', true], // not live (replaced since the pin): still served
      ['10.2.3', '/v1', false],
      // Not versions as the live sets hold them: a store answering what something else wrote.
      ['1.2.3+build', '/v1.2', false],
      ['1', '/v1', false],
      ['1.', '/v1.0', false],
      ['1.2.3\r\nInjected: yes', '/', false],
    ] as const) {
      expect(referenceMatches(v, p)).toBe(accepted)
      pinned = v
      expect((dispatcher.decide(request(p)) as { type: string }).type).toBe(accepted ? 'dispatch' : 'reply')
    }
    expect(reported).toBeGreaterThan(0)
  })
})
