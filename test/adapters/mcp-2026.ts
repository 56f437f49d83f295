/**
 * An App version of MCP 2026-07-28 for the tests that run that revision through the dispatch
 * layer: the official SDK v2 `createMcpHandler` in strict modern mode (2025-era traffic is
 * refused, and a request whose `Mcp-Method`, `Mcp-Name` or `Mcp-Param-{name}` headers are
 * missing or disagree with the body gets 400 `HeaderMismatch`, -32020).
 */
import { McpServer, createMcpHandler } from '@modelcontextprotocol/server'
import * as z from 'zod'

/** The protocol revision these Apps speak. */
export const MODERN = '2026-07-28'

/**
 * A strict 2026-07-28 App version. Tools: `forecast`, whose `region` argument the client mirrors
 * into `Mcp-Param-Region` (`x-mcp-header`), answering `<version>:<city>@<region>`; and
 * `test_simple_text`, which the conformance runner's scenarios call.
 */
export function createModernApp(version: string): { fetch(request: Request): Promise<Response> } {
  return createMcpHandler(
    () => {
      const server = new McpServer({ name: 'weather', version })
      server.registerTool(
        'forecast',
        {
          description: `Forecast (version ${version})`,
          inputSchema: z.object({ region: z.string().meta({ 'x-mcp-header': 'Region' }), city: z.string() }),
        },
        async ({ region, city }) => ({ content: [{ type: 'text', text: `${version}:${city}@${region}` }] }),
      )
      server.registerTool('test_simple_text', { description: 'One text block' }, async () => ({
        content: [{ type: 'text', text: 'This is a simple text response for testing.' }],
      }))
      return server
    },
    { legacy: 'reject' },
  )
}
