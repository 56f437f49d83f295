import { describe, expect, it } from 'vitest'
import { servedAt } from './token-api-paths.js'

describe('servedAt: the token a path names', () => {
  it('tells an item, its rotation and the collection apart', () => {
    expect(new Set([servedAt([]), servedAt(['abc']), servedAt(['abc', 'rotate'])]).size).toBe(3)
    expect(typeof servedAt(['abc'])).not.toBe('string')
  })

  it('takes an id of 1 to 64 unreserved URL characters as written, a UUID and an imported id alike', () => {
    for (const id of ['3f1c2a9e-5b7d-4c8e-9f00-1a2b3c4d5e6f', 'tok_imported_1', 'Tok.2~a', 'a'.repeat(64), '...']) {
      expect(servedAt([id]), id).toBe(servedAt(['abc']))
      expect(servedAt([id, 'rotate']), id).toBe(servedAt(['abc', 'rotate']))
    }
  })

  it('names no token for an id past 64 characters, with another character, or a dot segment', () => {
    for (const id of ['a'.repeat(65), 'tok 1', 'tok:1', 'tok/1', 'tök', '.', '..']) {
      expect(servedAt([id]), id).toBe('Token not found')
    }
  })
})
