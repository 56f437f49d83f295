/**
 * The forwarder of `npm run forward` (examples/platform/forwarder.ts) on its own: a client that
 * leaves before the platform answered is no outage, and a platform that cannot be reached is a
 * JSON-RPC 502, said once on stderr per outage.
 */
import * as http from 'node:http'
import type { AddressInfo } from 'node:net'
import { afterEach, describe, expect, it, vi } from 'vitest'
import { startForwarder } from '../../examples/platform/forwarder.js'

afterEach(() => vi.restoreAllMocks())

describe('the forwarder of npm run forward', () => {
  it('a client that leaves before the platform answers is not taken for the platform being down (regression: "cannot reach the platform" printed, and a later outage never)', async () => {
    const printed: string[] = []
    vi.spyOn(console, 'error').mockImplementation((line: unknown) => void printed.push(String(line)))
    const held: http.ServerResponse[] = []
    const platform = http.createServer((_req, res) => void held.push(res))
    await new Promise<void>((resolve) => platform.listen(0, '127.0.0.1', resolve))
    const port = (platform.address() as AddressInfo).port
    const forwarder = await startForwarder({ port, host: `weather.localhost:${port}`, authorization: 'Bearer svc_unused' })
    try {
      const leaving = new AbortController()
      const asked = fetch(`http://127.0.0.1:${forwarder.port}/v1`, { method: 'POST', body: '{}', signal: leaving.signal }).catch(() => 'left')
      await vi.waitFor(() => expect(held).toHaveLength(1), { timeout: 5_000, interval: 10 })
      leaving.abort()
      expect(await asked).toBe('left')
      // The platform sees its request end; nothing is said of an outage.
      await vi.waitFor(() => expect(held[0]!.req.destroyed || held[0]!.destroyed).toBe(true), { timeout: 5_000, interval: 10 })
      await new Promise((resolve) => setTimeout(resolve, 50))
      expect(printed).toEqual([])
      // Then the platform stops: each request gets the 502, and the outage is said once.
      platform.closeAllConnections()
      await new Promise<void>((resolve) => platform.close(() => resolve()))
      for (let i = 0; i < 2; i++) {
        const answer = await fetch(`http://127.0.0.1:${forwarder.port}/v1`, { method: 'POST', body: '{}' })
        expect(answer.status).toBe(502)
        expect(await answer.json()).toMatchObject({ error: { message: 'Platform unreachable', data: { error: 'bad_gateway', port } } })
      }
      expect(printed).toEqual([expect.stringMatching(new RegExp(`^forwarder: cannot reach the platform at 127\\.0\\.0\\.1:${port}: connect ECONNREFUSED`))])
    } finally {
      await forwarder.close()
      platform.closeAllConnections()
      platform.close()
    }
  })
})
