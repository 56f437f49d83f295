/**
 * The MCP handler samples of docs/adapters.md ("Your MCP handler: one SDK transport per
 * session") work as printed: the two code blocks are taken from the page, written to a module
 * and run, on the Web adapter (`webSessions`) and on Express (`nodeSessions`), with two MCP SDK
 * clients each (a single transport per version would refuse the second) and an unknown session.
 */
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs'
import * as http from 'node:http'
import type { IncomingMessage, ServerResponse } from 'node:http'
import { fileURLToPath } from 'node:url'
import { getRequestListener } from '@hono/node-server'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js'
import express from 'express'
import * as expressAdapter from 'mcp-dispatch/express'
import { mcpDispatch, routeByVersion } from 'mcp-dispatch/web'
import { describe, expect, it } from 'vitest'
import { buildAppServer } from '../../examples/platform/mcp-app.js'
import { createDemo } from '../../examples/shared/demo.js'
import { close, listen } from './helpers.js'

interface Samples {
  webSessions(build: () => McpServer): (request: Request) => Promise<Response>
  nodeSessions(build: () => McpServer): (req: IncomingMessage, res: ServerResponse, body?: unknown) => Promise<void>
}

const root = new URL('../../', import.meta.url)

/** The `ts` code blocks of docs/adapters.md's section on MCP handlers, as one module. */
async function loadSamples(): Promise<Samples> {
  const page = readFileSync(new URL('docs/adapters.md', root), 'utf8')
  const section = page.slice(page.indexOf('## Your MCP handler'), page.indexOf('## Web ('))
  const blocks = [...section.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!)
  expect(blocks).toHaveLength(2)
  expect(blocks[0]).toContain('export function webSessions')
  expect(blocks[1]).toContain('export function nodeSessions')
  // The second block says in prose where `StreamableHTTPServerTransport` comes from.
  const source = [
    blocks[0],
    "import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js'",
    blocks[1],
  ].join('\n')
  const dir = fileURLToPath(new URL('test/.generated/', root))
  mkdirSync(dir, { recursive: true })
  const file = `${dir}adapters-sessions.ts`
  writeFileSync(file, source)
  return (await import(/* @vite-ignore */ file)) as Samples
}

/** Two sessions in a row at `url`, each with its own SDK client; the version each saw. */
async function twoSessions(url: string, token: string): Promise<string[]> {
  const seen: string[] = []
  for (let i = 0; i < 2; i++) {
    const transport = new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: { authorization: `Bearer ${token}` } } })
    const client = new Client({ name: 'docs-samples', version: '1.0.0' })
    await client.connect(transport)
    const answer = await client.callTool({ name: 'get_version', arguments: {} })
    seen.push((answer.content as Array<{ text: string }>)[0]!.text)
    await transport.terminateSession()
    await client.close()
  }
  return seen
}

describe('docs/adapters.md: the MCP handler samples, as printed', () => {
  it('webSessions behind the Web adapter and nodeSessions behind Express: a session per client; an unknown one is 404 session_not_found', async () => {
    const { webSessions, nodeSessions } = await loadSamples()
    const demo = await createDemo()
    const handle = mcpDispatch({
      dispatcher: demo.dispatcher,
      handler: routeByVersion((app, version) => webSessions(() => buildAppServer(app, version))),
    })
    const web = http.createServer(getRequestListener((request) => handle(request, { clientAddress: '127.0.0.1' })))
    const app = express()
    app.use(expressAdapter.mcpDispatch({ dispatcher: demo.dispatcher }))
    app.use(express.json())
    app.use(
      expressAdapter.routeByVersion((appRecord, version) => {
        const serve = nodeSessions(() => buildAppServer(appRecord, version))
        return (req, res) => serve(req, res, req.body)
      }),
    )
    const node = http.createServer(app)
    const ports = { web: await listen(web), express: await listen(node) }
    try {
      for (const port of Object.values(ports)) {
        expect(await twoSessions(`http://127.0.0.1:${port}/v1`, demo.token)).toEqual(['1.0.0', '1.0.0'])
        expect(await twoSessions(`http://127.0.0.1:${port}/`, demo.token)).toEqual(['2.0.0', '2.0.0'])
      }
      // A session the handler does not know (it restarted, say): the dispatch layer's own 404.
      const expected = { jsonrpc: '2.0', id: null, error: { code: -32004, message: 'Session not found', data: { error: 'session_not_found' } } }
      const lost = { method: 'POST', headers: { 'mcp-session-id': 'gone', 'content-type': 'application/json' }, body: '{}' }
      const webAnswer = await webSessions(() => buildAppServer(demo.app, '1.0.0'))(new Request('http://127.0.0.1/v1', lost))
      expect(webAnswer.status).toBe(404)
      expect(await webAnswer.json()).toEqual(expected)
      const bare = http.createServer((req, res) => void nodeSessions(() => buildAppServer(demo.app, '1.0.0'))(req, res))
      try {
        const bareAnswer = await fetch(`http://127.0.0.1:${await listen(bare)}/v1`, lost)
        expect(bareAnswer.status).toBe(404)
        expect(await bareAnswer.json()).toEqual(expected)
      } finally {
        await close(bare)
      }
    } finally {
      await close(web)
      await close(node)
    }
  })
})
