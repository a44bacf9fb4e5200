package hutch.spark.jvm;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/**
 * The stream connections of a JVM (driver and executors alike), kept between probes and read tasks: at most
 * {@link #POOL_IDLE} idle per address (user, address, vhost, TLS), given back only between subscriptions; the
 * counterpart of {@code spark/pool.py}. {@link #onMember} moves a read or a probe to a node that holds the
 * stream ({@code stream_source.on_member}).
 */
final class Pool {
    static final int POOL_IDLE = 8;
    private static final Map<String, ArrayDeque<StreamConnection>> IDLE = new ConcurrentHashMap<>();

    private Pool() {
    }

    private static String key(ReadOptions o, String address) {
        return (o.tls ? "tls:" + o.cacertfile + "|" + o.certfile + "|" + o.verify + "|" + o.serverName + ":" : "")
                + o.user + "@" + address + "/" + o.vhost;
    }

    private static ArrayDeque<StreamConnection> idle(ReadOptions o, String address) {
        return IDLE.computeIfAbsent(key(o, address), k -> new ArrayDeque<>());
    }

    /** A kept connection to one of {@code addrs} ({host, port}, in order), else a new one to the first that
     * answers. */
    static StreamConnection take(ReadOptions o, List<Object[]> addrs, String purpose) {
        for (Object[] a : addrs) {
            ArrayDeque<StreamConnection> q = idle(o, ReadOptions.address((String) a[0], (Integer) a[1]));
            synchronized (q) {
                StreamConnection c = q.poll();
                if (c != null) {
                    return c;
                }
            }
        }
        return o.connect(purpose, addrs);
    }

    static void giveBack(ReadOptions o, StreamConnection c) {
        ArrayDeque<StreamConnection> q = idle(o, c.address);
        synchronized (q) {
            if (q.size() < POOL_IDLE) {
                q.add(c);
                return;
            }
        }
        c.close();
    }

    /** Close every idle connection of the read's addresses (one died while idle: a broker restart?). */
    static void forgetIdle(ReadOptions o) {
        for (Object[] a : o.addresses()) {
            ArrayDeque<StreamConnection> q = idle(o, ReadOptions.address((String) a[0], (Integer) a[1]));
            synchronized (q) {
                for (StreamConnection c : q) {
                    c.close();
                }
                q.clear();
            }
        }
    }

    /** The connection to read {@code stream} on: {@code c} when its node holds the stream (its leader or a
     * replica, as the metadata command names them; asked once per connection and stream), else a kept or new
     * one to the first member that answers ({@code c} goes back to the pool); {@code c} when the broker places
     * the stream nowhere (missing: the read's own error says so) or no member answers at its advertised
     * address. */
    static StreamConnection onMember(ReadOptions o, StreamConnection c, String stream, String purpose) {
        if (c.placed.contains(stream)) {
            return c;
        }
        List<String> members = c.members(stream);
        if (members == null || members.isEmpty() || members.contains(c.advertised)) {
            c.placed.add(stream);
            return c;
        }
        List<Object[]> addrs = new ArrayList<>();
        for (String m : members) {
            int colon = m.lastIndexOf(':');
            String host = m.substring(0, colon);
            if (host.startsWith("[")) {
                host = host.substring(1, host.length() - 1);
            }
            addrs.add(new Object[] {host, Integer.parseInt(m.substring(colon + 1))});
        }
        StreamConnection moved;
        try {
            moved = take(o, addrs, purpose);
        } catch (StreamConnection.StreamError e) {
            if (e.code != 0) {
                throw e;
            }
            c.placed.add(stream);
            return c;
        }
        moved.placed.add(stream);
        giveBack(o, c);
        return moved;
    }
}
