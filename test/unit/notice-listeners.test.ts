// The memory store's listeners (src/store/memory/notice-listeners.ts): each
// stream's own, told in the order they subscribed.
import t from 'tap'
import { NoticeListeners } from '../../src/store/memory/notice-listeners.js'
import type { StreamNotice } from '../../src/store/contract.js'

const notice = (streamId: string, toSeq: number): StreamNotice => ({ streamId, toSeq, events: [], ended: false })

t.test('a notice goes to the listeners of its session and stream only', async t => {
  const listeners = new NoticeListeners()
  const heard: string[] = []
  listeners.subscribe('A', 's', n => heard.push(`1:${n.toSeq}`))
  listeners.subscribe('A', 's', n => heard.push(`2:${n.toSeq}`))
  listeners.subscribe('A', 't', n => heard.push(`t:${n.toSeq}`))
  listeners.subscribe('B', 's', n => heard.push(`B:${n.toSeq}`))
  listeners.notify('A', notice('s', 1))
  t.same(heard, ['1:1', '2:1'])
  listeners.notify('C', notice('s', 2))
  t.same(heard, ['1:1', '2:1'], 'nobody listens there')
})

t.test('unsubscribing stops notices, also from within a notice', async t => {
  const listeners = new NoticeListeners()
  const heard: string[] = []
  const second = (n: StreamNotice): void => { heard.push(`2:${n.toSeq}`) }
  let unsubscribeSecond = (): void => {}
  const unsubscribeFirst = listeners.subscribe('A', 's', n => {
    heard.push(`1:${n.toSeq}`)
    unsubscribeSecond()
  })
  unsubscribeSecond = listeners.subscribe('A', 's', second)
  listeners.notify('A', notice('s', 1))
  t.same(heard, ['1:1', '2:1'], 'a notice under way still reaches everyone who listened when it began')
  listeners.notify('A', notice('s', 2))
  t.same(heard, ['1:1', '2:1', '1:2'])
  unsubscribeFirst()
  listeners.notify('A', notice('s', 3))
  t.same(heard, ['1:1', '2:1', '1:2'])
  unsubscribeFirst()
  listeners.subscribe('A', 's', n => heard.push(`3:${n.toSeq}`))
  listeners.clear()
  listeners.notify('A', notice('s', 4))
  t.same(heard, ['1:1', '2:1', '1:2'], 'cleared: nobody left')
})
