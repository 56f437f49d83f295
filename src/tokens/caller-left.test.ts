/**
 * A caller that leaves at any await of a creation or a rotation (`SecretCallOptions.signal`):
 * each store, App store, subscription store and bus call of the operation is held until the
 * test lets it go, and the caller's signal aborts while the k-th one waits, for every k. Whatever
 * the point, a secret is never handed to a caller that left before the call answered, nothing is
 * written once it has left, and the store ends as that caller believes it to be: no active token
 * made for it, the old secret of a rotation working and the new one not.
 */
import { describe, expect, it } from 'vitest'
import type { AppStore, InvalidationBus, SubscriptionStore, TokenStore } from '../core/stores.js'
import { createMemoryAppStore, createMemoryInvalidationBus, createMemorySubscriptionStore, createMemoryTokenStore } from '../stores/memory/index.js'
import { type ApiTokenSecretView, createTokenService } from './token-service.js'

/** Calls that wait until let go; `armed` false lets every call through at once. */
function gates() {
  const waiting: Array<{ name: string; go: () => void }> = []
  let armed = false
  const passed: string[] = []
  const gate = <A extends unknown[], R>(name: string, call: (...args: A) => R) =>
    (async (...args: A) => {
      if (armed) {
        await new Promise<void>((go) => waiting.push({ name, go }))
        passed.push(name)
      }
      return call(...args)
    }) as unknown as (...args: A) => R
  return {
    gate,
    waiting,
    passed,
    arm: (on: boolean) => void (armed = on),
  }
}

const turn = () => new Promise<void>((resolve) => setImmediate(resolve))

function setup() {
  const g = gates()
  const innerStore = createMemoryTokenStore()
  const store: TokenStore = {
    ...innerStore,
    insert: g.gate('tokens.insert', innerStore.insert),
    findByHash: g.gate('tokens.findByHash', innerStore.findByHash),
    get: g.gate('tokens.get', innerStore.get),
    listByUser: g.gate('tokens.listByUser', innerStore.listByUser),
    countActiveByUser: g.gate('tokens.countActiveByUser', innerStore.countActiveByUser!),
    rotate: g.gate('tokens.rotate', (...args: Parameters<TokenStore['rotate']>) => innerStore.rotate(...args)),
    revoke: g.gate('tokens.revoke', innerStore.revoke),
    touch: g.gate('tokens.touch', innerStore.touch),
  }
  const innerApps = createMemoryAppStore([{ id: 'app_weather', slug: 'weather', name: 'Weather', versions: ['1.0.0'] }])
  const apps: AppStore = { ...innerApps, getApp: g.gate('apps.getApp', innerApps.getApp) }
  const innerSubscriptions = createMemorySubscriptionStore([{ userId: 'alice', appId: 'app_weather', active: true }])
  const subscriptions: SubscriptionStore = { isActive: g.gate('subscriptions.isActive', innerSubscriptions.isActive) }
  const innerBus = createMemoryInvalidationBus()
  const invalidations: InvalidationBus = { ...innerBus, publish: g.gate('bus.publish', innerBus.publish.bind(innerBus)), subscribe: innerBus.subscribe.bind(innerBus) }
  const reports: Array<{ error: unknown; context: string }> = []
  const tokens = createTokenService({ store, apps, subscriptions, invalidations, onError: (error, context) => void reports.push({ error, context }) })
  return { g, tokens, innerStore, reports }
}

/**
 * Runs `call` with every await held, aborting its signal while the `k`-th held call waits;
 * answers how it settled, and whether the caller had left by then. `undefined` when `call`
 * settled before its k-th await (k past the last).
 */
async function leaveAt<T>(g: ReturnType<typeof gates>, k: number, call: (signal: AbortSignal) => Promise<T>) {
  const controller = new AbortController()
  g.arm(true)
  let settled: { ok: true; value: T } | { ok: false; error: unknown } | undefined
  const running = call(controller.signal).then(
    (value) => void (settled = { ok: true, value }),
    (error: unknown) => void (settled = { ok: false, error }),
  )
  let seen = 0
  for (let spins = 0; settled === undefined && spins < 10_000; spins++) {
    await turn()
    const next = g.waiting.shift()
    if (next === undefined) continue
    if (seen++ === k) controller.abort(new Error('the caller left'))
    next.go()
  }
  await running
  g.arm(false)
  return { settled: settled!, left: controller.signal.aborted, awaits: seen }
}

/** How many held calls `call` makes, none aborted. */
async function awaitsOf(call: (s: ReturnType<typeof setup>, signal: AbortSignal) => Promise<unknown>, prepare?: (s: ReturnType<typeof setup>) => Promise<unknown>) {
  const s = setup()
  await prepare?.(s)
  const { awaits, settled } = await leaveAt(s.g, Infinity, (signal) => call(s, signal))
  expect(settled.ok).toBe(true)
  await s.tokens.close()
  return awaits
}

const input = { userId: 'alice', name: 'CI', servers: ['app_weather'], expiresInDays: 30 as const }

describe('a caller that leaves at any await of a creation or a rotation', () => {
  it('a rotation undone for a caller that left, whose undo fails, is reported as such (not as one whose caller was told 503)', async () => {
    const s = setup()
    const made = await s.tokens.create(input)
    const controller = new AbortController()
    let rotations = 0
    const rotate = s.innerStore.rotate
    s.innerStore.rotate = (...args) => {
      // The rotation lands, its caller leaves; the undo that follows fails.
      if (++rotations === 1) {
        controller.abort(new Error('the caller left'))
        return rotate(...args)
      }
      throw new Error('connection lost')
    }
    await expect(s.tokens.rotate(made.id, { kind: 'session', userId: 'alice' }, { signal: controller.signal })).rejects.toThrow('the caller left')
    expect(s.reports.map((r) => [r.context, (r.error as Error).message])).toEqual([
      ['token store', `token ${made.id}: a rotation that landed though its caller had left could not be undone`],
    ])
    await s.tokens.close()
  })

  it('create: no active token is left for a caller who left, and none is handed to it', async () => {
    const total = await awaitsOf((s, signal) => s.tokens.create(input, { signal }))
    expect(total).toBeGreaterThanOrEqual(4)
    for (let k = 0; k < total; k++) {
      const s = setup()
      const { settled, left } = await leaveAt(s.g, k, (signal) => s.tokens.create(input, { signal }))
      expect(left, `k=${k}`).toBe(true)
      expect(settled.ok, `k=${k}: a secret handed to a caller that left`).toBe(false)
      // Nothing is written once its caller has left (the insert held at k is already on its way).
      const inserted = s.g.passed.indexOf('tokens.insert')
      expect(inserted === -1 || inserted <= k, `k=${k}: an insert for a caller that left (${s.g.passed.join(', ')})`).toBe(true)
      const active = (await s.innerStore.listByUser('alice')).filter((t) => t.revokedAt === null)
      expect(active, `k=${k}`).toEqual([])
      expect(s.reports, `k=${k}`).toEqual([])
      // The same request sent again works.
      const again = await s.tokens.create(input)
      expect((await s.tokens.authenticate(again.token)).ok).toBe(true)
      await s.tokens.close()
    }
  })

  for (const kind of ['token', 'session'] as const) {
    it(`rotate by ${kind}: the old secret still works and the new one does not, for a caller who left at any await`, async () => {
      const rotate = (s: ReturnType<typeof setup>, created: ApiTokenSecretView, signal: AbortSignal | undefined) =>
        s.tokens.rotate(created.id, kind === 'token' ? { kind, token: created.token, clientAddress: undefined } : { kind, userId: 'alice' }, { signal })
      let created: ApiTokenSecretView | undefined
      const total = await awaitsOf(
        (s, signal) => rotate(s, created!, signal),
        async (s) => (created = await s.tokens.create(input)),
      )
      expect(total).toBeGreaterThanOrEqual(3)
      for (let k = 0; k < total; k++) {
        const s = setup()
        const made = await s.tokens.create(input)
        const { settled, left } = await leaveAt(s.g, k, (signal) => rotate(s, made, signal))
        expect(left, `k=${k}`).toBe(true)
        expect(settled.ok, `k=${k}: a new secret handed to a caller that left`).toBe(false)
        // Nothing is written once its caller has left (the rotation held at k is already on
        // its way): the old secret is never refused meanwhile.
        const rotated = s.g.passed.indexOf('tokens.rotate')
        expect(rotated === -1 || rotated <= k, `k=${k}: a rotation for a caller that left (${s.g.passed.join(', ')})`).toBe(true)
        expect((await s.tokens.authenticate(made.token)).ok, `k=${k}: the old secret`).toBe(true)
        expect(s.reports, `k=${k}`).toEqual([])
        // The same rotation sent again works, and its secret does.
        const again = await rotate(s, made, undefined)
        expect((await s.tokens.authenticate(again.token)).ok).toBe(true)
        expect((await s.tokens.authenticate(made.token)).ok).toBe(false)
        await s.tokens.close()
      }
    })
  }
})
