import { describe, expect, it } from 'vitest'
import { callgrindSelfCosts, frameName, growth, perfMapLookup } from './functions.js'

describe('perfMapLookup', () => {
  const lookup = perfMapLookup(
    [
      '1000 100 JS:*decide file:///tmp/x/node_modules/.cache/mcp-dispatch-bench/server.mjs:10:3',
      '2000 40 Builtins_StringAdd_CheckNone',
      'not a line of the map',
      // V8 reused the memory of collected code: the later lines name what runs there now.
      '1020 10 JS:~recompiled node:internal/x:1:1',
      '2000 20 JS:*reused node:internal/y:1:1',
      '',
    ].join('\n'),
  )

  it('names the code object holding an address, its end excluded', () => {
    expect(lookup(0x1000)).toMatch(/decide/)
    expect(lookup(0x101f)).toMatch(/decide/)
    expect(lookup(0x1100)).toBeUndefined()
    expect(lookup(0xfff)).toBeUndefined()
  })

  it('takes the newer code object where the memory was reused', () => {
    expect(lookup(0x1025)).toMatch(/recompiled/)
    expect(lookup(0x2010)).toMatch(/reused/)
    // Past the newer object's end, the collected one no longer answers.
    expect(lookup(0x2027)).toBeUndefined()
  })
})

describe('callgrindSelfCosts', () => {
  // As callgrind writes it: names compressed to `(id)` after their first use, in `fn=` and
  // `cfn=` lines alike; the cost line after `calls=` is the call's inclusive cost.
  const dump = [
    'events: Ir',
    'summary: 1111',
    'ob=(1) /usr/bin/node',
    'fl=(1) ???',
    'fn=(1) 0x0000000000001010',
    '0 100',
    'cfn=(2) Builtins_StringAdd_CheckNone',
    'calls=3 0',
    '0 500',
    '+2 20',
    'fn=(2)',
    '0 400',
    'fn=(3) 0x0000000000001080',
    '* 5',
    'fn=(4) 0x0000000000009000',
    '-1 6',
    'fn=(1)',
    '0 80',
    '',
  ].join('\n')
  const nameOf = perfMapLookup(
    [
      '1000 40 JS:*decide file:///tmp/x/node_modules/.cache/mcp-dispatch-bench/server.mjs:10:3',
      '1080 40 JS:^decide file:///tmp/x/node_modules/.cache/mcp-dispatch-bench/server.mjs:10:3',
    ].join('\n'),
  )

  it('sums self costs per function, calls left out, tiers of one function together', () => {
    expect(Object.fromEntries(callgrindSelfCosts(dump, nameOf))).toEqual({
      'decide server.mjs:10:3': 100 + 20 + 80 + 5,
      Builtins_StringAdd_CheckNone: 400,
      '0x0000000000009000': 6,
    })
  })

  it('leaves JIT addresses as they are without a map', () => {
    const costs = callgrindSelfCosts(dump)
    expect(costs.get('0x0000000000001010')).toBe(200)
    expect(costs.get('0x0000000000001080')).toBe(5)
  })
})

describe('growth', () => {
  it('lists the largest increases first, functions of one side only included', () => {
    const base = new Map([
      ['a', 10],
      ['b', 50],
      ['gone', 30],
    ])
    const other = new Map([
      ['a', 15],
      ['b', 40],
      ['new', 100],
    ])
    expect(growth(base, other, 3)).toEqual([
      { name: 'new', base: 0, other: 100 },
      { name: 'a', base: 10, other: 15 },
      { name: 'b', base: 50, other: 40 },
    ])
  })
})

describe('frameName', () => {
  it('drops tier marks, bundle paths and node_modules paths', () => {
    expect(frameName('JS:*writeHead file:///work/main/node_modules/.cache/mcp-dispatch-bench/server.mjs:1845:40')).toBe(
      'writeHead server.mjs:1845:40',
    )
    expect(frameName('JS:~hookRunner /work/main/node_modules/fastify/lib/hooks.js:231:30')).toBe('hookRunner fastify/lib/hooks.js:231:30')
    expect(frameName('llhttp__internal_execute')).toBe('llhttp__internal_execute')
  })
})
