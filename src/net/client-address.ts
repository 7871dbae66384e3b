import { isIP } from 'node:net'

/** The eight 16-bit groups of an IPv6 address (zone dropped, embedded IPv4 split), or undefined. */
function ipv6Groups (address: string): number[] | undefined {
  let text = address.split('%', 1)[0] as string
  const v4 = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(text)
  if (v4 !== null) {
    const [a, b, c, d] = v4.slice(1).map(Number) as [number, number, number, number]
    text = `${text.slice(0, v4.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`
  }
  const [head, tail] = text.split('::') as [string, string | undefined]
  const left = head === '' ? [] : head.split(':')
  const right = tail === undefined || tail === '' ? [] : tail.split(':')
  const missing = 8 - left.length - right.length
  if (tail === undefined ? missing !== 0 : missing < 1) return undefined
  return [...left, ...Array<string>(tail === undefined ? 0 : missing).fill('0'), ...right].map(g => Number.parseInt(g, 16))
}

/**
 * The key one client's connections and requests are counted under: an IPv4
 * address as it is (an IPv4-mapped IPv6 peer as its IPv4 address), an IPv6
 * address by its /64, the smallest prefix a site is given (RFC 6177): one
 * host holds a whole /64 and can take any address in it.
 */
export function clientKey (address: string): string {
  if (isIP(address) !== 6) return address
  const groups = ipv6Groups(address)
  if (groups === undefined) return address
  if (groups.slice(0, 5).every(g => g === 0) && groups[5] === 0xffff) {
    const [hi, lo] = [groups[6] as number, groups[7] as number]
    return `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`
  }
  return `${groups.slice(0, 4).map(g => g.toString(16)).join(':')}::/64`
}
