import { describe, expect, it } from 'vitest'
import { compileTrustProxy, forwardedProtocol, resolveClientAddress, schemeOf } from './client-address.js'

describe('compileTrustProxy', () => {
  it('false, undefined and 0 trust nobody', () => {
    expect(compileTrustProxy(false)).toBe(false)
    expect(compileTrustProxy(undefined)).toBe(false)
    expect(compileTrustProxy(0)).toBe(false)
  })

  it('keeps a hop count', () => {
    expect(compileTrustProxy(2)).toBe(2)
  })

  it('refuses bad hop counts with a TypeError', () => {
    for (const n of [-1, 1.5, Number.NaN, Number.POSITIVE_INFINITY]) expect(() => compileTrustProxy(n)).toThrow(TypeError)
  })

  it('refuses true (trust every proxy) and strings, saying what it takes', () => {
    for (const bad of [true, '10.0.0.1', {}]) {
      expect(() => compileTrustProxy(bad as never)).toThrow(/false, a hop count, or a list/)
    }
  })

  it('names an entry that is no string (a list read from JSON), not a TypeError of its own reading', () => {
    // Before: "entry.indexOf is not a function", "Cannot read properties of null".
    expect(() => compileTrustProxy(['10.0.0.1', 5] as never)).toThrow(new TypeError('trustProxy: entry 1 is a number, not an address or CIDR range'))
    expect(() => compileTrustProxy([null] as never)).toThrow(new TypeError('trustProxy: entry 0 is null, not an address or CIDR range'))
  })

  it('refuses a range that trusts every IPv4 peer, as true would, naming the entry', () => {
    // IPv4 peers are matched as ::ffff:0:0/96: an IPv6 range holding that block holds them all.
    for (const range of ['0.0.0.0/0', '::/0', '::ffff:0:0/96', '::/64', '::ffff:0.0.0.0/96']) {
      expect(() => compileTrustProxy(['10.0.0.0/8', range]), range).toThrow(TypeError)
      expect(() => compileTrustProxy(['10.0.0.0/8', range]), range).toThrow(/trustProxy: entry 1 .* trusts every IPv4 peer/)
    }
    // Half of IPv4, or IPv6 ranges apart from the mapped block, are the platform's to judge.
    expect(compileTrustProxy(['0.0.0.0/1', '2001:db8::/32', 'fc00::/7'])).toHaveLength(3)
  })

  it('refuses ranges that together trust every IPv4 peer, or every global IPv6 peer (2000::/3), naming them', () => {
    expect(() => compileTrustProxy(['0.0.0.0/1', '10.0.0.0/8', '128.0.0.0/1'])).toThrow(
      /trustProxy: entry 0 \("0\.0\.0\.0\/1"\), entry 1 \("10\.0\.0\.0\/8"\), entry 2 \("128\.0\.0\.0\/1"\) together trust every IPv4 peer/,
    )
    expect(() => compileTrustProxy(['0.0.0.0/2', '64.0.0.0/2', '128.0.0.0/2', '::ffff:192.0.0.0/98'])).toThrow(/together trust every IPv4 peer/)
    expect(() => compileTrustProxy(['2000::/3'])).toThrow(/entry 0 \("2000::\/3"\) trusts every global IPv6 peer/)
    expect(() => compileTrustProxy(['2000::/4', '3000::/4'])).toThrow(/together trust every global IPv6 peer/)
    // A gap anywhere: the platform's to judge.
    expect(compileTrustProxy(['0.0.0.0/2', '64.0.0.0/2', '128.0.0.0/2', '192.0.0.0/3'])).toHaveLength(4)
    expect(compileTrustProxy(['2000::/4', '3000::/5'])).toHaveLength(2)
  })

  it('refuses ranges that together trust every peer of a family in whatever order they are listed', () => {
    expect(() => compileTrustProxy(['128.0.0.0/1', '0.0.0.0/1'])).toThrow(
      /trustProxy: entry 0 \("128\.0\.0\.0\/1"\), entry 1 \("0\.0\.0\.0\/1"\) together trust every IPv4 peer/,
    )
    expect(() => compileTrustProxy(['::ffff:192.0.0.0/98', '128.0.0.0/2', '64.0.0.0/2', '0.0.0.0/2'])).toThrow(/together trust every IPv4 peer/)
    expect(() => compileTrustProxy(['3000::/4', '10.0.0.0/8', '2000::/4'])).toThrow(/entry 0 .*, entry 2 .* together trust every global IPv6 peer/)
  })

  it('names only the ranges that meet the block they together cover, not the others of the list', () => {
    expect(() => compileTrustProxy(['::1', '0.0.0.0/1', 'fe80::/10', '128.0.0.0/1'])).toThrow(
      'trustProxy: entry 1 ("0.0.0.0/1"), entry 3 ("128.0.0.0/1") together trust every IPv4 peer',
    )
  })

  it('accepts ranges that leave a single IPv4 address untrusted, and refuses them once it is listed too', () => {
    const ipv4 = (n: number) => [n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255].join('.')
    // 0.0.0.0/1, 128.0.0.0/2, …, 255.255.255.254/32: every IPv4 address but 255.255.255.255.
    const allButLast = Array.from({ length: 32 }, (_, i) => `${ipv4(2 ** 32 - 2 ** (32 - i))}/${i + 1}`)
    expect(allButLast.at(-1)).toBe('255.255.255.254/32')
    expect(compileTrustProxy(allButLast)).toHaveLength(32)
    expect(() => compileTrustProxy([...allButLast, '255.255.255.255'])).toThrow(/together trust every IPv4 peer/)
  })

  it('compiles a list of addresses and ranges, refusing a bad entry with a TypeError', () => {
    expect(compileTrustProxy(['10.0.0.0/8', '::1'])).toHaveLength(2)
    expect(() => compileTrustProxy(['10.0.0.0/8', 'proxy.internal'])).toThrow(TypeError)
    expect(() => compileTrustProxy(['10.0.0.0/8', 'proxy.internal'])).toThrow(/trustProxy: entry 1/)
  })
})

describe('resolveClientAddress', () => {
  const xff = '203.0.113.9, 198.51.100.7, 10.0.0.1'

  it('trustProxy false ignores X-Forwarded-For (DESIGN.md)', () => {
    expect(resolveClientAddress('10.0.0.2', xff, false)).toBe('10.0.0.2')
    expect(resolveClientAddress('10.0.0.2', '1.2.3.4', compileTrustProxy(false))).toBe('10.0.0.2')
  })

  it('without X-Forwarded-For the socket address is the client', () => {
    expect(resolveClientAddress('10.0.0.2', null, 1)).toBe('10.0.0.2')
    expect(resolveClientAddress('10.0.0.2', undefined, compileTrustProxy(['10.0.0.0/8']))).toBe('10.0.0.2')
    expect(resolveClientAddress('10.0.0.2', '', 1)).toBe('10.0.0.2')
  })

  it('an unknown socket address stays unknown', () => {
    expect(resolveClientAddress(undefined, xff, 1)).toBeUndefined()
    expect(resolveClientAddress(undefined, xff, false)).toBeUndefined()
    // What a platform's JavaScript may pass from a header lookup: no peer either, so the
    // header is not taken on its word.
    for (const none of [null, '']) {
      expect(resolveClientAddress(none as never, xff, 1)).toBeUndefined()
      expect(resolveClientAddress(none as never, xff, compileTrustProxy(['10.0.0.0/8']))).toBeUndefined()
      expect(forwardedProtocol(none as never, 'https', 1)).toBeUndefined()
    }
  })

  describe('hop count', () => {
    it('1 trusts the socket peer: the client is the last X-Forwarded-For entry', () => {
      expect(resolveClientAddress('10.0.0.2', xff, 1)).toBe('10.0.0.1')
    })

    it('n trusts the socket peer and the n - 1 proxies before it', () => {
      expect(resolveClientAddress('10.0.0.2', xff, 2)).toBe('198.51.100.7')
      expect(resolveClientAddress('10.0.0.2', xff, 3)).toBe('203.0.113.9')
    })

    it('more hops than the chain gives the leftmost entry', () => {
      expect(resolveClientAddress('10.0.0.2', xff, 10)).toBe('203.0.113.9')
    })

    it('a client cannot push itself in front of trusted hops by adding entries', () => {
      // The client sent "X-Forwarded-For: 1.1.1.1"; the one trusted proxy appended the real peer.
      expect(resolveClientAddress('10.0.0.2', '1.1.1.1, 203.0.113.9', 1)).toBe('203.0.113.9')
    })

    it('ignores empty entries and spaces', () => {
      expect(resolveClientAddress('10.0.0.2', ' 203.0.113.9 ,, ', 1)).toBe('203.0.113.9')
    })
  })

  describe('list of trusted proxies', () => {
    const trusted = compileTrustProxy(['10.0.0.0/8', '2001:db8::/32'])

    it('walks from the right while the hop is trusted', () => {
      expect(resolveClientAddress('10.0.0.2', xff, trusted)).toBe('198.51.100.7')
      expect(resolveClientAddress('10.0.0.2', '203.0.113.9, 10.9.9.9', trusted)).toBe('203.0.113.9')
    })

    it('an untrusted socket peer is the client, whatever the header says', () => {
      expect(resolveClientAddress('198.51.100.1', xff, trusted)).toBe('198.51.100.1')
    })

    it('every hop trusted: the leftmost entry is the client', () => {
      expect(resolveClientAddress('10.0.0.2', '10.1.1.1, 10.2.2.2', trusted)).toBe('10.1.1.1')
    })

    it('matches IPv6 and IPv4-mapped peers', () => {
      expect(resolveClientAddress('2001:db8::5', '203.0.113.9', trusted)).toBe('203.0.113.9')
      expect(resolveClientAddress('::ffff:10.0.0.2', '203.0.113.9', trusted)).toBe('203.0.113.9')
    })

    it('stops at a garbage hop and returns it, so an allowlist check fails closed', () => {
      expect(resolveClientAddress('10.0.0.2', '203.0.113.9, unknown, 10.0.0.1', trusted)).toBe('unknown')
    })

    it('an empty list trusts nobody', () => {
      expect(resolveClientAddress('10.0.0.2', xff, compileTrustProxy([]))).toBe('10.0.0.2')
    })
  })
})

describe('X-Forwarded-For hops written with a port', () => {
  it('drops the port of v4:port and [v6]:port hops from a trusted proxy', () => {
    const trust = compileTrustProxy(['10.0.0.0/8'])
    expect(resolveClientAddress('10.0.0.2', '203.0.113.9:51000', trust)).toBe('203.0.113.9')
    expect(resolveClientAddress('10.0.0.2', '[2001:db8::7]:443', trust)).toBe('2001:db8::7')
  })

  it('keeps a hop whose "port" has more than 5 digits whole: it is no address:port', () => {
    const trust = compileTrustProxy(['10.0.0.0/8'])
    expect(resolveClientAddress('10.0.0.2', '203.0.113.9:65535', trust)).toBe('203.0.113.9')
    expect(resolveClientAddress('10.0.0.2', '203.0.113.9:123456', trust)).toBe('203.0.113.9:123456')
  })
})

describe('forwardedProtocol', () => {
  const proxies = compileTrustProxy(['10.0.0.0/8', '::1'])

  it('ignores X-Forwarded-Proto unless the socket peer is a trusted proxy', () => {
    expect(forwardedProtocol('10.0.0.2', 'https', false)).toBeUndefined()
    expect(forwardedProtocol('203.0.113.9', 'https', proxies)).toBeUndefined()
    expect(forwardedProtocol(undefined, 'https', proxies)).toBeUndefined()
    expect(forwardedProtocol(undefined, 'https', 1)).toBeUndefined()
    expect(forwardedProtocol('not an address', 'https', proxies)).toBeUndefined()
  })

  it('a trusted peer (in the list, or any peer under a hop count) sets the scheme: the first value', () => {
    expect(forwardedProtocol('10.0.0.2', 'https', proxies)).toBe('https')
    expect(forwardedProtocol('::1', 'http', proxies)).toBe('http')
    expect(forwardedProtocol('203.0.113.9', 'https', 1)).toBe('https')
    expect(forwardedProtocol('10.0.0.2', 'https, http', proxies)).toBe('https')
    expect(forwardedProtocol('10.0.0.2', ' HTTPS ', proxies)).toBe('https')
  })

  it('a value that names no App scheme, or none, keeps the request\'s own', () => {
    for (const value of ['ws', 'wss', 'ftp', 'https:', 'http s', '', null, undefined, ', https']) {
      expect(forwardedProtocol('10.0.0.2', value, proxies), String(value)).toBeUndefined()
    }
  })
})

describe('schemeOf', () => {
  it('reads http and https in any case, around whitespace; nothing else', () => {
    expect(schemeOf('HTTPS')).toBe('https')
    expect(schemeOf(' http\t')).toBe('http')
    for (const value of ['javascript', 'https://', 'ws', '']) expect(schemeOf(value), value).toBeUndefined()
  })
})
