/**
 * The PostgreSQL token store under the real pipeline: the token API, the token service, the
 * dispatcher and the Web adapter in front of MCP SDK servers, served on 127.0.0.1, driven by
 * the official SDK client and plain HTTP. A token's whole life reaches the table; two
 * instances on one database agree within their cache TTL; an unreachable or silent
 * PostgreSQL gives 503, never a 200, and never a hung request.
 */
import * as net from 'node:net'
import { generateApiToken } from 'mcp-dispatch'
import { describe, expect, it } from 'vitest'
import { postgresUnavailable, unreachablePostgresUrl, usePostgres } from '../helpers/postgres.js'
import { type Instance, asAlice, initialize, postgresPipelineSuite, startInstance } from './postgres-pipeline-suite.js'

const unavailable = await postgresUnavailable()

describe.skipIf(unavailable !== undefined)('PostgreSQL token store through the pipeline', () => {
  const postgres = usePostgres()

  postgresPipelineSuite(postgres, { preparedStatements: true })

  describe('PostgreSQL unreachable: 503 with Retry-After, never a 200, never a hang', () => {
    async function expectUnavailable(instance: Instance, withinMs: number): Promise<void> {
      const started = Date.now()
      const response = await initialize(instance, generateApiToken())
      expect(response.status).toBe(503)
      expect(response.headers.get('retry-after')).toMatch(/^\d+$/)
      expect(response.headers.get('x-mcp-version')).toBeNull()
      expect(await response.json()).toMatchObject({ error: { code: -32005, data: { error: 'temporarily_unavailable' } } })
      expect(Date.now() - started).toBeLessThan(withinMs)
      expect(instance.errors.map((e) => e.context)).toContain('token failed')
      const create = await asAlice(instance, 'POST', '', { name: 'CI', servers: ['app_weather'], expires_in_days: 30 })
      expect(create.status).toBe(503)
      expect(await create.json()).toMatchObject({ error: 'temporarily_unavailable' })
    }

    it('connection refused (nothing listens on the port)', async () => {
      const pool = postgres.openPool({ connectionString: await unreachablePostgresUrl(), connectionTimeoutMillis: 300 })
      const instance = await startInstance({ pool })
      try {
        await expectUnavailable(instance, 2_000)
      } finally {
        await instance.close()
      }
    })

    describe('a server that accepts connections and never answers', () => {
      async function silentServer(): Promise<{ url: string; close(): Promise<void> }> {
        const sockets = new Set<net.Socket>()
        const server = net.createServer((socket) => {
          sockets.add(socket)
          socket.on('close', () => sockets.delete(socket))
        })
        await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
        const { port } = server.address() as net.AddressInfo
        return {
          url: `postgres://postgres@127.0.0.1:${port}/test`,
          close: () =>
            new Promise<void>((resolve) => {
              for (const socket of sockets) socket.destroy()
              server.close(() => resolve())
            }),
        }
      }

      it("the pool's connection timeout gives up first", async () => {
        const silent = await silentServer()
        const pool = postgres.openPool({ connectionString: silent.url, connectionTimeoutMillis: 300 })
        const instance = await startInstance({ pool })
        try {
          await expectUnavailable(instance, 2_000)
        } finally {
          await instance.close()
          await silent.close()
        }
      })

      it("without a connection timeout, the dispatcher's store timeout answers", async () => {
        const silent = await silentServer()
        const pool = postgres.openPool({ connectionString: silent.url, connectionTimeoutMillis: 0 })
        const instance = await startInstance({ pool, storeTimeoutMs: 300 })
        try {
          const started = Date.now()
          const response = await initialize(instance, generateApiToken())
          expect(response.status).toBe(503)
          await response.body?.cancel()
          expect(Date.now() - started).toBeLessThan(2_000)
        } finally {
          await instance.close()
          // Ends the connection attempts still waiting, so the pool can end.
          await silent.close()
        }
      })
    })
  })
})
