/**
 * The Web adapter (`mcp-dispatch/web`) against the shared suite: in memory with `Request`
 * objects, over loopback HTTP (`@hono/node-server`) for streaming.
 */
import { getDispatchContext, mcpDispatch } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { HOST, createFixture } from './helpers.js'
import { describeAdapter } from './suite.js'
import { startWeb } from './targets.js'

describeAdapter('web', startWeb)

describe('web adapter specifics', () => {
  it('getDispatchContext finds the context of a dispatched request, and throws for another', async () => {
    const fixture = createFixture()
    let seen: string | undefined
    const handle = mcpDispatch({
      dispatcher: fixture.dispatcher,
      handler: (request) => {
        seen = getDispatchContext(request).version
        return new Response('ok')
      },
    })
    const res = await handle(
      new Request(`http://${HOST}/v1`, { method: 'POST', headers: { authorization: `Bearer ${fixture.tokens.alice}` }, body: '{}' }),
    )
    expect(res.status).toBe(200)
    expect(seen).toBe('1.0.0')
    expect(() => getDispatchContext(new Request('http://weather.localhost/'))).toThrow(TypeError)
  })
})
