import { describe, expect, it } from 'vitest'
import {
  type IpRange,
  checkIpAllowlist,
  compileAllowlist,
  ipInRange,
  parseCidr,
  parseIp,
  validateAllowlist,
} from './ip.js'

function range(entry: string): IpRange {
  const r = parseCidr(entry)
  if (typeof r === 'string') throw new Error(`expected ${entry} to parse, got ${r}`)
  return r
}

describe('parseIp: IPv4', () => {
  it('parses dotted quads into the IPv4-mapped range', () => {
    expect(parseIp('192.0.2.1')).toEqual([0, 0, 0xffff, 0xc0000201])
    expect(parseIp('0.0.0.0')).toEqual([0, 0, 0xffff, 0])
    expect(parseIp('255.255.255.255')).toEqual([0, 0, 0xffff, 0xffffffff])
  })

  it('refuses anything else', () => {
    for (const bad of [
      '',
      ' ',
      '1.2.3',
      '1.2.3.4.5',
      '256.0.0.1',
      '1.2.3.-1',
      '01.2.3.4',
      '1.2.3.04',
      '1..3.4',
      '1.2.3.4.',
      '1.2.3.',
      '.1.2.3.4',
      '1.2.3.a',
      '0x1.2.3.4',
      '1.2.3.1000',
      '１.2.3.4',
      'localhost',
      '1.2.3.4/32',
    ]) {
      expect(parseIp(bad), JSON.stringify(bad)).toBeNull()
    }
  })

  it('tolerates surrounding whitespace', () => {
    expect(parseIp(' 10.0.0.1 ')).toEqual(parseIp('10.0.0.1'))
  })
})

describe('parseIp: IPv6', () => {
  it('parses the full form', () => {
    expect(parseIp('2001:0db8:0000:0000:0000:0000:0000:0001')).toEqual([0x20010db8, 0, 0, 1])
    expect(parseIp('2001:db8:0:0:0:0:0:1')).toEqual([0x20010db8, 0, 0, 1])
  })

  it('parses compressed forms', () => {
    expect(parseIp('2001:db8::1')).toEqual([0x20010db8, 0, 0, 1])
    expect(parseIp('::1')).toEqual([0, 0, 0, 1])
    expect(parseIp('::')).toEqual([0, 0, 0, 0])
    expect(parseIp('1::')).toEqual([0x00010000, 0, 0, 0])
    expect(parseIp('1:2:3:4:5:6:7::')).toEqual([0x00010002, 0x00030004, 0x00050006, 0x00070000])
    expect(parseIp('::2:3:4:5:6:7:8')).toEqual([0x00000002, 0x00030004, 0x00050006, 0x00070008])
    expect(parseIp('fe80::1:2')).toEqual([0xfe800000, 0, 0, 0x00010002])
  })

  it('is case-insensitive', () => {
    expect(parseIp('2001:DB8::ABCD')).toEqual(parseIp('2001:db8::abcd'))
  })

  it('parses embedded IPv4 in the last 32 bits', () => {
    expect(parseIp('::ffff:192.0.2.1')).toEqual([0, 0, 0xffff, 0xc0000201])
    expect(parseIp('64:ff9b::192.0.2.1')).toEqual([0x0064ff9b, 0, 0, 0xc0000201])
    expect(parseIp('1:2:3:4:5:6:192.0.2.1')).toEqual([0x00010002, 0x00030004, 0x00050006, 0xc0000201])
    expect(parseIp('::192.0.2.1')).toEqual([0, 0, 0, 0xc0000201])
  })

  it('strips brackets and zone ids', () => {
    expect(parseIp('[::1]')).toEqual([0, 0, 0, 1])
    expect(parseIp('fe80::1%eth0')).toEqual([0xfe800000, 0, 0, 1])
    expect(parseIp('[fe80::1%25en0]')).toEqual([0xfe800000, 0, 0, 1])
  })

  it('refuses a text longer than 64 characters once trimmed, whatever it holds (a long zone id too)', () => {
    const zoned = (length: number) => `fe80::1%${'e'.repeat(length - 8)}`
    expect(parseIp(zoned(64))).toEqual([0xfe800000, 0, 0, 1])
    expect(parseIp(` ${zoned(64)} `)).toEqual([0xfe800000, 0, 0, 1])
    expect(parseIp(zoned(65))).toBeNull()
  })

  it('IPv4-mapped IPv6 equals the IPv4 address, in every spelling', () => {
    const v4 = parseIp('10.0.0.1')
    expect(parseIp('::ffff:10.0.0.1')).toEqual(v4)
    expect(parseIp('::ffff:a00:1')).toEqual(v4)
    expect(parseIp('0:0:0:0:0:ffff:a00:1')).toEqual(v4)
    expect(parseIp('[::FFFF:10.0.0.1]')).toEqual(v4)
    // IPv4-compatible (deprecated) is a different address.
    expect(parseIp('::10.0.0.1')).not.toEqual(v4)
  })

  it('refuses malformed addresses', () => {
    for (const bad of [
      ':',
      ':::',
      '1:2:3:4:5:6:7',
      '1:2:3:4:5:6:7:8:9',
      '1:2:3:4::5:6:7:8',
      '1::2::3',
      ':1:2:3:4:5:6:7:8',
      '1:2:3:4:5:6:7:8:',
      '1::2:',
      '12345::1',
      'g::1',
      '::ffff:1.2.3',
      '::ffff:256.1.1.1',
      '::ffff:1.2.3.',
      '1.2.3.4::',
      '::1.2.3.4:5',
      '1:2:3:4:5:6:7:1.2.3.4',
      '[::1',
      '::1]',
      '::-1',
      ' : ',
      'x'.repeat(65),
      '::ffff:1.2.3.4' + ' '.repeat(60) + 'x',
    ]) {
      expect(parseIp(bad), JSON.stringify(bad)).toBeNull()
    }
  })
})

describe('parseCidr', () => {
  it('parses a single address as a full-length range', () => {
    expect(range('192.0.2.1')).toEqual({ words: [0, 0, 0xffff, 0xc0000201], bits: 128 })
    expect(range('2001:db8::1')).toEqual({ words: [0x20010db8, 0, 0, 1], bits: 128 })
  })

  it('IPv4 prefixes live in the mapped range (bits + 96)', () => {
    expect(range('0.0.0.0/0').bits).toBe(96)
    expect(range('10.0.0.0/8').bits).toBe(104)
    expect(range('192.0.2.7/32').bits).toBe(128)
  })

  it('IPv6 prefixes', () => {
    expect(range('::/0').bits).toBe(0)
    expect(range('2001:db8::/32').bits).toBe(32)
    expect(range('2001:db8:1:2::/64').bits).toBe(64)
    expect(range('2001:db8::1/128').bits).toBe(128)
  })

  it('refuses host bits after the prefix', () => {
    expect(parseCidr('192.0.2.1/24')).toBe('host-bits')
    expect(parseCidr('10.0.0.1/8')).toBe('host-bits')
    expect(parseCidr('1.0.0.0/0')).toBe('host-bits')
    expect(parseCidr('2001:db8::1/64')).toBe('host-bits')
    expect(parseCidr('2001:db8::/16')).toBe('host-bits')
    expect(parseCidr('::1/0')).toBe('host-bits')
  })

  it('refuses bad prefixes', () => {
    for (const bad of [
      '10.0.0.0/33',
      '10.0.0.0/',
      '10.0.0.0/-1',
      '10.0.0.0/08',
      '10.0.0.0/8.0',
      '10.0.0.0/8/8',
      '10.0.0.0/ 8',
      '10.0.0.0/x',
      '10.0.0.0/1000',
      '::/129',
      '::/256',
      '::/',
    ]) {
      expect(parseCidr(bad), bad).toBe('prefix')
    }
  })

  it('refuses bad addresses', () => {
    for (const bad of ['', '/8', 'x/8', '10.0.0/8', '1::2::3/64', '10.0.0.0.0/8']) {
      expect(parseCidr(bad), bad).toBe('address')
    }
  })
})

describe('ipInRange', () => {
  it('/0, /8, /32 for IPv4', () => {
    const all4 = range('0.0.0.0/0')
    expect(ipInRange(parseIp('1.2.3.4')!, all4)).toBe(true)
    expect(ipInRange(parseIp('255.255.255.255')!, all4)).toBe(true)
    // 0.0.0.0/0 is every IPv4 address, not every IPv6 address.
    expect(ipInRange(parseIp('2001:db8::1')!, all4)).toBe(false)

    const ten = range('10.0.0.0/8')
    expect(ipInRange(parseIp('10.0.0.0')!, ten)).toBe(true)
    expect(ipInRange(parseIp('10.255.255.255')!, ten)).toBe(true)
    expect(ipInRange(parseIp('11.0.0.0')!, ten)).toBe(false)
    expect(ipInRange(parseIp('9.255.255.255')!, ten)).toBe(false)

    const one = range('192.0.2.7/32')
    expect(ipInRange(parseIp('192.0.2.7')!, one)).toBe(true)
    expect(ipInRange(parseIp('192.0.2.8')!, one)).toBe(false)
  })

  it('/0, /64, /128 for IPv6', () => {
    const all = range('::/0')
    expect(ipInRange(parseIp('2001:db8::1')!, all)).toBe(true)
    expect(ipInRange(parseIp('10.0.0.1')!, all)).toBe(true)

    const net = range('2001:db8:1:2::/64')
    expect(ipInRange(parseIp('2001:db8:1:2:ffff:ffff:ffff:ffff')!, net)).toBe(true)
    expect(ipInRange(parseIp('2001:db8:1:2::')!, net)).toBe(true)
    expect(ipInRange(parseIp('2001:db8:1:3::')!, net)).toBe(false)

    const host = range('2001:db8::1/128')
    expect(ipInRange(parseIp('2001:db8::1')!, host)).toBe(true)
    expect(ipInRange(parseIp('2001:db8::2')!, host)).toBe(false)
  })

  it('a prefix that does not fall on a word boundary', () => {
    const r = range('10.0.0.0/13')
    expect(ipInRange(parseIp('10.7.255.255')!, r)).toBe(true)
    expect(ipInRange(parseIp('10.8.0.0')!, r)).toBe(false)
    const r6 = range('2001:db8:8000::/33')
    expect(ipInRange(parseIp('2001:db8:ffff::1')!, r6)).toBe(true)
    expect(ipInRange(parseIp('2001:db8:7fff::1')!, r6)).toBe(false)
  })

  it('an IPv4 range matches the IPv4-mapped IPv6 spelling of a client, and the reverse', () => {
    expect(ipInRange(parseIp('::ffff:10.1.2.3')!, range('10.0.0.0/8'))).toBe(true)
    expect(ipInRange(parseIp('10.1.2.3')!, range('::ffff:10.0.0.0/104'))).toBe(true)
  })
})

describe('compileAllowlist / validateAllowlist', () => {
  it('null and undefined mean no allowlist', () => {
    expect(compileAllowlist(null)).toBeNull()
    expect(compileAllowlist(undefined)).toBeNull()
  })

  it('compiles entries in order', () => {
    expect(compileAllowlist(['10.0.0.0/8', '::1'])).toEqual([range('10.0.0.0/8'), range('::1')])
    expect(compileAllowlist([])).toEqual([])
  })

  it('throws a RangeError naming the bad entry and its index', () => {
    expect(() => compileAllowlist(['10.0.0.0/8', '10.0.0.1/8'])).toThrow(RangeError)
    expect(() => compileAllowlist(['10.0.0.0/8', '10.0.0.1/8'])).toThrow(/entry 1 .*host bits/)
    expect(() => compileAllowlist(['nope'])).toThrow(/entry 0 \("nope"\) is not an IPv4\/IPv6 address/)
    expect(() => compileAllowlist(['::/200'])).toThrow(/entry 0 .*invalid prefix length/)
  })

  it('validateAllowlist reports the first bad entry as a value', () => {
    expect(validateAllowlist(['10.0.0.0/8', '::1'])).toBeNull()
    // The list as the token service takes it: `[]` would allow no address (null means none).
    expect(validateAllowlist([])).toEqual({ index: null, message: expect.stringMatching(/^must name at least one/) })
    expect(validateAllowlist(Array(101).fill('10.0.0.1'))).toEqual({ index: null, message: 'at most 100 entries' })
    expect(validateAllowlist(Array(100).fill('10.0.0.1'))).toBeNull()
    expect(validateAllowlist(['1'.repeat(65)])).toEqual({ index: 0, message: expect.stringMatching(/is longer than 64 characters$/) })
    expect(validateAllowlist(['1'.repeat(64)])).toEqual({ index: 0, message: expect.stringMatching(/is not an IPv4\/IPv6 address or CIDR range$/) })
    expect(validateAllowlist(['10.0.0.0/8', 'x', 'y'])).toEqual({ index: 1, message: expect.stringMatching(/^entry 1/) })
  })

  it('validateAllowlist refuses what parseCidr would drop: spaces around an entry, a zone index, URL brackets', () => {
    expect(validateAllowlist([' 127.0.0.1'])).toEqual({ index: 0, message: 'entry 0 (" 127.0.0.1") has spaces around it' })
    expect(validateAllowlist(['::1', '10.0.0.0/8\t'])).toEqual({ index: 1, message: 'entry 1 ("10.0.0.0/8\\t") has spaces around it' })
    expect(validateAllowlist(['fe80::1%eth0'])).toEqual({ index: 0, message: expect.stringContaining('zone index') })
    for (const bracketed of ['[2001:db8::1]', '[192.0.2.1]', '[2001:db8::]/32']) {
      expect(validateAllowlist(['10.0.0.0/8', bracketed])).toEqual({ index: 1, message: expect.stringContaining('brackets') })
    }
    // Client addresses keep both leniencies: a socket may report a zone.
    expect(parseIp(' fe80::1%eth0 ')).toEqual(parseIp('fe80::1'))
  })

  it('validateAllowlist takes a record as a seed or an import holds it: null is no allowlist, anything else but strings is refused, never thrown on', () => {
    expect(validateAllowlist(null)).toBeNull()
    expect(validateAllowlist(undefined)).toBeNull()
    for (const notList of ['10.0.0.1', 42, { 0: '10.0.0.1' }, true]) {
      expect(validateAllowlist(notList)).toEqual({ index: null, message: 'must be an array of addresses or CIDR ranges, or null for no allowlist' })
    }
    expect(validateAllowlist(['10.0.0.1', null])).toEqual({ index: 1, message: 'entry 1 is null, not an address or CIDR range' })
    expect(validateAllowlist([42])).toEqual({ index: 0, message: 'entry 0 is a number, not an address or CIDR range' })
    expect(validateAllowlist([['10.0.0.1']])).toEqual({ index: 0, message: 'entry 0 is an array, not an address or CIDR range' })
    expect(validateAllowlist([{}])).toEqual({ index: 0, message: 'entry 0 is an object, not an address or CIDR range' })
    // eslint-disable-next-line no-sparse-arrays
    expect(validateAllowlist(['10.0.0.1', , '::1'])).toEqual({ index: 1, message: 'entry 1 is undefined, not an address or CIDR range' })
  })

  it('shortens a huge entry in the message', () => {
    const bad = validateAllowlist(['x'.repeat(1000)])
    expect(bad!.message.length).toBeLessThan(200)
  })
})

describe('checkIpAllowlist (spec 5.2)', () => {
  const list = compileAllowlist(['10.0.0.0/8', '2001:db8::/32', '192.0.2.7'])

  it('a null list allows every address, even an unknown one', () => {
    expect(checkIpAllowlist('203.0.113.1', null)).toBe(true)
    expect(checkIpAllowlist(undefined, null)).toBe(true)
    expect(checkIpAllowlist('garbage', null)).toBe(true)
  })

  it('allows addresses inside any range', () => {
    expect(checkIpAllowlist('10.1.2.3', list)).toBe(true)
    expect(checkIpAllowlist('::ffff:10.1.2.3', list)).toBe(true)
    expect(checkIpAllowlist('2001:db8:1::5', list)).toBe(true)
    expect(checkIpAllowlist('[2001:db8::5]', list)).toBe(true)
    expect(checkIpAllowlist('192.0.2.7', list)).toBe(true)
  })

  it('refuses addresses outside every range', () => {
    expect(checkIpAllowlist('11.0.0.1', list)).toBe(false)
    expect(checkIpAllowlist('192.0.2.8', list)).toBe(false)
    expect(checkIpAllowlist('2001:db9::1', list)).toBe(false)
    expect(checkIpAllowlist('::1', list)).toBe(false)
  })

  it('fails closed for an unknown or unparsable address', () => {
    expect(checkIpAllowlist(undefined, list)).toBe(false)
    expect(checkIpAllowlist('', list)).toBe(false)
    expect(checkIpAllowlist('garbage', list)).toBe(false)
    expect(checkIpAllowlist('10.1.2.3:443', list)).toBe(false)
    expect(checkIpAllowlist('10.1.2.3, 10.1.2.4', list)).toBe(false)
  })

  it('an empty list allows nobody', () => {
    expect(checkIpAllowlist('10.0.0.1', compileAllowlist([]))).toBe(false)
  })
})

