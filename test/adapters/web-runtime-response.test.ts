/**
 * The Web adapter in a process whose global `Response` is the runtime's own (Deno, Bun,
 * Workers; Node before @hono/node-server puts its light class in the global's place, which the
 * other Web adapter tests' servers do): a `Response` of `fetch()`, with immutable headers, is of
 * the global class, so only the copy made for those headers can tell that the handler read or
 * locked its body. A file of its own (the `isolated` project), so no server of another file has
 * replaced the global.
 */
import { mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { HOST, createFixture } from './helpers.js'

describe('web adapter, the global Response the runtime’s own: a fetched Response whose body the handler used', () => {
  it.each(['read', 'locked'])('%s: the 502 with the dispatch headers, onError told the handler answered a body that cannot be sent', async (used) => {
    const fixture = createFixture()
    const errors: unknown[] = []
    let fetched: Response | undefined
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      onError: (error) => errors.push(error),
      handler: async () => {
        fetched = await fetch('data:application/json,{}')
        if (used === 'read') await fetched.text()
        else fetched.body!.getReader()
        return fetched
      },
    })
    const response = await handle(new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' }))
    // The case this file is for: fetch's Response is of the global class.
    expect(Object.getPrototypeOf(fetched)).toBe(Response.prototype)
    expect(response.status).toBe(502)
    expect(response.headers.get('x-mcp-version')).toBe('1.0.0')
    expect(await response.json()).toMatchObject({ id: null, error: { data: { error: 'handler_error' } } })
    expect(errors.map((error) => (error as Error).message)).toEqual([
      'mcp-dispatch: the handler answered with a Response whose body was already read or is locked, which cannot be sent',
    ])
  })
})
