import { BlockList, isIP } from 'node:net'

/** Named ranges TRUSTED_PROXIES accepts (the names proxy-addr and so fastify's trustProxy know). */
const PRESETS: Record<string, ReadonlyArray<readonly [string, number]>> = {
  loopback: [['127.0.0.0', 8], ['::1', 128]],
  linklocal: [['169.254.0.0', 16], ['fe80::', 10]],
  uniquelocal: [['10.0.0.0', 8], ['172.16.0.0', 12], ['192.168.0.0', 16], ['fc00::', 7]]
}

function family (address: string): 'ipv4' | 'ipv6' {
  return isIP(address) === 6 ? 'ipv6' : 'ipv4'
}

/**
 * The addresses of TRUSTED_PROXIES as a BlockList (which also matches
 * IPv4-mapped IPv6 peers such as ::ffff:10.0.0.1). Problems are pushed, not thrown.
 */
export function trustedProxyList (entries: readonly string[], problems: string[] = []): BlockList {
  const list = new BlockList()
  for (const entry of entries) {
    const preset = PRESETS[entry.toLowerCase()]
    if (preset !== undefined) {
      for (const [net, prefix] of preset) list.addSubnet(net, prefix, family(net))
      continue
    }
    const [address = '', prefixText] = entry.split('/')
    const bits = isIP(address) === 6 ? 128 : 32
    const prefix = prefixText === undefined ? bits : /^\d{1,3}$/.test(prefixText) ? Number(prefixText) : NaN
    if (isIP(address) === 0 || !(prefix >= 0 && prefix <= bits)) {
      problems.push(`TRUSTED_PROXIES: "${entry}" is not an address, a CIDR range (10.0.0.0/8) or one of loopback, linklocal, uniquelocal`)
      continue
    }
    list.addSubnet(address, prefix, family(address))
  }
  return list
}

export function isTrusted (list: BlockList, address: string | undefined): boolean {
  return address !== undefined && isIP(address) !== 0 && list.check(address, family(address))
}
