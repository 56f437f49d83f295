import type { IncomingMessage } from 'node:http'
import { describe, expect, it } from 'vitest'
import { platformHeaders, requestProtocol, requireContext } from './node-http.js'

/** A request on a socket that is TLS (`encrypted`) or not. */
const onSocket = (encrypted: boolean) => ({ socket: encrypted ? { encrypted: true } : {} }) as unknown as IncomingMessage

describe('requestProtocol (the scheme of the App address on Express and Fastify)', () => {
  it('without a framework scheme (Express without X-Forwarded-Proto), is the socket\'s: https on a TLS socket, http on a plain one', () => {
    expect(requestProtocol(onSocket(true), undefined)).toBe('https')
    expect(requestProtocol(onSocket(false), undefined)).toBe('http')
    expect(requestProtocol({ socket: null } as unknown as IncomingMessage, undefined)).toBe('http')
  })

  it('takes the framework\'s http or https in any case, and falls back to the socket\'s for any other (ws, an empty one)', () => {
    expect(requestProtocol(onSocket(false), 'HTTPS')).toBe('https')
    expect(requestProtocol(onSocket(true), 'http')).toBe('http')
    expect(requestProtocol(onSocket(true), 'ws')).toBe('https')
    expect(requestProtocol(onSocket(false), '')).toBe('http')
  })
})

describe('platformHeaders (what the 502 of a failed handler keeps of the platform\'s headers)', () => {
  it('keeps the platform\'s own headers as named, and leaves out those of a body or a session, in any case, and Express\'s X-Powered-By', () => {
    expect(
      platformHeaders({
        'Access-Control-Allow-Origin': 'https://allowed.example',
        'X-Request-Id': 'r-1',
        'Content-Type': 'text/html',
        'Content-Encoding': 'gzip',
        'Mcp-Session-Id': 'never-pinned',
        ETag: '"v1"',
        'Content-Location': '/v1/x',
        'X-Powered-By': 'Express',
        'x-dropped': undefined,
      }),
    ).toEqual({ 'Access-Control-Allow-Origin': 'https://allowed.example', 'X-Request-Id': 'r-1' })
    // One another framework set under that name is the platform's.
    expect(platformHeaders({ 'x-powered-by': 'Acme' })).toEqual({ 'x-powered-by': 'Acme' })
    expect(platformHeaders({ 'content-length': 12, 'transfer-encoding': 'chunked', 'last-modified': 'x', 'content-range': 'bytes 0-1/2' })).toBeUndefined()
  })
})

describe('requireContext (a handler reached without the adapter in front of it)', () => {
  it('throws a TypeError naming what to register for the framework: the Express middleware, the Fastify plugin', () => {
    expect(() => requireContext(undefined, 'express')).toThrow(
      new TypeError('mcp-dispatch: no dispatch context on this request; register the express mcpDispatch middleware before this handler'),
    )
    expect(() => requireContext(undefined, 'fastify')).toThrow(
      new TypeError('mcp-dispatch: no dispatch context on this request; register the fastify mcpDispatch plugin before this handler'),
    )
  })
})
