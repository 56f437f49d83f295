import type { DispatchRequest } from 'mcp-dispatch'

/**
 * A neutral request for `dispatcher.decide`: `POST` to `path` on weather.example.com from
 * 203.0.113.7, with `headers` (lower-case names).
 */
export function dispatchRequest(path: string, headers: Readonly<Record<string, string>> = {}): DispatchRequest {
  return {
    method: 'POST',
    path,
    host: 'weather.example.com',
    origin: 'https://weather.example.com',
    headers: { get: (name) => headers[name] },
    clientAddress: '203.0.113.7',
  }
}
