package hutch.spark.jvm;

import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import javax.net.ssl.SSLSocket;

/**
 * One connection speaking RabbitMQ's stream protocol, blocking, for the JVM reader: the handshake (peer
 * properties, SASL PLAIN, tune, open), a stream's stats, one subscription at a time with credit, and the
 * driver's probes built on it (the stream's first chunk, its exact committed end, the chunk at a
 * timestamp). The Java counterpart of {@code hutch/spark/streamclient.py}, reading only.
 *
 * Over TLS when the read's uri is {@code amqps://} ({@link Tls}: the uri's PEM files and verify rules).
 *
 * <p>Rules: one thread, the caller's; every wait has a deadline (the socket's read timeout); a frame is
 * at most {@link #MAX_FRAME_BYTES} (a chunk comes whole in one frame); chunks queued for the subscription
 * are at most the credit granted (a chunk beyond it is a protocol error); a broker heartbeat is answered.
 */
final class StreamConnection implements AutoCloseable {
    static final int MAX_FRAME_BYTES = 128 * 1024 * 1024;
    static final int MAX_CREDIT = 64;
    static final int OFFSET_FIRST = 1, OFFSET_LAST = 2, OFFSET_NEXT = 3, OFFSET_OFFSET = 4, OFFSET_TIMESTAMP = 5;
    static final int CODE_OK = 1, CODE_STREAM_DOES_NOT_EXIST = 2;
    private static final int PEER_PROPERTIES = 0x11, SASL_HANDSHAKE = 0x12, SASL_AUTHENTICATE = 0x13, TUNE = 0x14,
            OPEN = 0x15, CLOSE = 0x16, HEARTBEAT = 0x17, SUBSCRIBE = 0x07, DELIVER = 0x08, CREDIT = 0x09,
            UNSUBSCRIBE = 0x0C, METADATA = 0x0F, METADATA_UPDATE = 0x10, PARTITIONS = 0x19, STREAM_STATS = 0x1C;

    /** The connection or a command failed; {@code code} is the protocol's response code (0: socket/timeout). */
    static final class StreamError extends RuntimeException {
        private static final long serialVersionUID = 1L;
        final int code;

        StreamError(String text, int code) {
            super(text);
            this.code = code;
        }
    }

    private final Socket socket;
    private final DataInputStream in;
    private final OutputStream out;
    private final String where;
    private final int timeoutMs;  // the longest wait for an answer or for the rest of a frame once it began
    private int correlation = 0;
    private int subscription = -1;
    private int lastSubscription = 0;  // ids rotate over 0..255: a chunk of a closed one is told apart
    private int credit = 0;
    private final ArrayDeque<byte[]> chunks = new ArrayDeque<>();
    private ByteBuffer reply;  // the response to the RPC in progress (after key, version, correlation id)
    private int waitingKey, waitingCorrelation;
    private Integer tuneFrameMax, tuneHeartbeat;
    /** This node's advertised "host:port" (the open response's advertised_host/port; null: not said). */
    String advertised;
    /** The address dialled, "host:port" (the pool's key part). */
    final String address;
    /** Streams this connection's node was found to hold (or to have no placement for): no metadata again. */
    final java.util.Set<String> placed = new java.util.HashSet<>();

    StreamConnection(ReadOptions o, String host, int port, String name) {
        where = (o.tls ? "rabbitmq-stream+tls://" : "rabbitmq-stream://") + o.user + "@" + host + ":" + port;
        address = ReadOptions.address(host, port);
        this.timeoutMs = o.readTimeoutMs;
        Socket raw = new Socket();
        Socket s = raw;
        try {
            raw.connect(new InetSocketAddress(host, port), o.connectTimeoutMs);
            raw.setTcpNoDelay(true);
            raw.setReceiveBufferSize(1 << 20);
            if (o.tls) {
                raw.setSoTimeout(o.connectTimeoutMs);
                SSLSocket tls = Tls.wrap(o, raw, host, port);
                s = tls;
                tls.startHandshake();
            }
            s.setSoTimeout(timeoutMs);
            socket = s;
            in = new DataInputStream(new BufferedInputStream(s.getInputStream(), 1 << 18));
            out = s.getOutputStream();
            handshake(o.user, o.password, o.vhost, name);
        } catch (javax.net.ssl.SSLException e) {
            closeQuietly(s);
            // answered, and refused: the same on every node (not passed over for the next host)
            throw new StreamError("handshake with " + where + " failed: " + e.getMessage(), -1);
        } catch (IOException e) {
            closeQuietly(s);
            throw new StreamError("cannot connect to " + where + ": " + e.getMessage()
                    + " (is the stream protocol listener on? option 'streamPort')", 0);
        } catch (RuntimeException e) {
            closeQuietly(s);
            throw e;
        }
    }

    private static void closeQuietly(Socket s) {
        try {
            s.close();
        } catch (IOException ignored) {
            // closing a socket that failed: nothing more to do
        }
    }

    String where() {
        return where;
    }

    private void handshake(String user, String password, String vhost, String name) throws IOException {
        Frame f = request(PEER_PROPERTIES);
        f.i32(2).str("product").str("hutch-spark-jvm").str("connection_name").str(name);
        rpc(f);
        ByteBuffer mechs = rpc(request(SASL_HANDSHAKE));
        int n = mechs.getInt();
        boolean plain = false;
        for (int i = 0; i < n; i++) {
            plain |= "PLAIN".equals(readStr(mechs));
        }
        if (!plain) {
            throw new StreamError(where + " does not offer PLAIN authentication", 0);
        }
        byte[] u = user.getBytes(StandardCharsets.UTF_8), p = password.getBytes(StandardCharsets.UTF_8);
        byte[] secret = new byte[u.length + p.length + 2];
        System.arraycopy(u, 0, secret, 1, u.length);
        System.arraycopy(p, 0, secret, u.length + 2, p.length);
        rpc(request(SASL_AUTHENTICATE).str("PLAIN").bytes(secret));
        while (tuneFrameMax == null) {
            readFrame();
        }
        Frame tune = new Frame().u16(TUNE).u16(1).i32(tuneFrameMax).i32(tuneHeartbeat);
        send(tune);
        ByteBuffer opened = rpc(request(OPEN).str(vhost));
        if (opened.remaining() >= 4) {
            int np = opened.getInt();
            String host = null, port = null;
            for (int i = 0; i < np && opened.remaining() >= 4; i++) {
                String k = readStr(opened), v = readStr(opened);
                if ("advertised_host".equals(k)) {
                    host = v;
                } else if ("advertised_port".equals(k)) {
                    port = v;
                }
            }
            if (host != null && port != null && port.matches("\\d{1,5}")) {
                advertised = ReadOptions.address(host, Integer.parseInt(port));
            }
        }
    }

    /** The partition streams of a super stream, in partition order. */
    List<String> partitions(String superStream) {
        ByteBuffer b = rpc(request(PARTITIONS).str(superStream));
        int n = b.getInt();
        List<String> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            out.add(readStr(b));
        }
        return out;
    }

    /** The members of {@code stream} (its leader first, then its replicas) as advertised "host:port"; null when
     * the broker places it nowhere (missing, or no answer for it). The {@code metadata} command. */
    List<String> members(String stream) {
        ByteBuffer b = rpcNoCode(request(METADATA).i32(1).str(stream));
        Map<Integer, String> brokers = new HashMap<>();
        int nb = b.getInt();
        for (int i = 0; i < nb; i++) {
            int ref = b.getShort() & 0xffff;
            String host = readStr(b);
            int port = b.getInt();
            brokers.put(ref, ReadOptions.address(host, port));
        }
        int ns = b.getInt();
        List<String> found = null;
        for (int i = 0; i < ns; i++) {
            String name = readStr(b);
            int code = b.getShort() & 0xffff;
            int leader = b.getShort() & 0xffff;
            int nr = b.getInt();
            List<String> members = new ArrayList<>();
            if (brokers.containsKey(leader)) {
                members.add(brokers.get(leader));
            }
            for (int r = 0; r < nr; r++) {
                String replica = brokers.get(b.getShort() & 0xffff);
                if (replica != null && !members.contains(replica)) {
                    members.add(replica);
                }
            }
            if (code == CODE_OK && stream.equals(name)) {
                found = members;
            }
        }
        return found;
    }

    // -- commands ----------------------------------------------------------------------------------

    /** The stream's stats (e.g. committed_chunk_id: -1 when nothing is committed). */
    Map<String, Long> stats(String stream) {
        ByteBuffer b = rpc(request(STREAM_STATS).str(stream));
        int n = b.getInt();
        Map<String, Long> out = new HashMap<>();
        for (int i = 0; i < n; i++) {
            String k = readStr(b);
            out.put(k, b.getLong());
        }
        return out;
    }

    void subscribe(String stream, int offsetType, long value, int initialCredit) {
        if (subscription >= 0) {
            throw new IllegalStateException("one subscription at a time");
        }
        subscription = lastSubscription = (lastSubscription + 1) & 0xff;
        credit = initialCredit;
        chunks.clear();
        Frame f = request(SUBSCRIBE).u8(subscription).str(stream).u16(offsetType);
        if (offsetType == OFFSET_OFFSET || offsetType == OFFSET_TIMESTAMP) {
            f.i64(value);
        }
        f.u16(initialCredit).i32(0);
        try {
            rpc(f);
        } catch (StreamError e) {
            subscription = -1;
            throw e;
        }
    }

    void credit(int n) {
        credit += n;
        send(new Frame().u16(CREDIT).u16(1).u8(subscription).u16(n));
    }

    /** The next chunk of the subscription (a user chunk or any other: the caller looks at its type), or null
     * when none came within {@code waitMs} and {@code noneIsNull}; else a StreamError on the timeout. */
    byte[] nextChunk(long waitMs, boolean noneIsNull) {
        long deadline = System.currentTimeMillis() + waitMs;
        while (chunks.isEmpty()) {
            long left = deadline - System.currentTimeMillis();
            if (left <= 0) {
                if (noneIsNull) {
                    return null;
                }
                throw new StreamError(where + ": no chunk for " + waitMs / 1000.0 + " s", 0);
            }
            try {
                // wait at most until the deadline for a frame to begin (mark/reset: nothing is consumed when
                // none does), then read it whole with the connection's timeout: a short wait never cuts a
                // frame in the middle
                socket.setSoTimeout((int) Math.max(1, left));
                in.mark(1);
                if (in.read() < 0) {
                    throw new StreamError(where + " closed the connection", 0);
                }
                in.reset();
                socket.setSoTimeout(timeoutMs);
                readFrame();
            } catch (SocketTimeoutException e) {
                // the deadline is checked at the top of the loop
            } catch (IOException e) {
                throw new StreamError(where + ": the connection failed: " + e.getMessage(), 0);
            }
        }
        return chunks.poll();
    }

    void unsubscribe() {
        if (subscription < 0) {
            return;
        }
        rpc(request(UNSUBSCRIBE).u8(subscription));
        subscription = -1;
        chunks.clear();
    }

    /** Close the subscription without waiting for the broker's answer (one round trip less per read task
     * and probe): the broker handles a connection's commands in order, so the next command's answer comes
     * after this one's; until then the answer and any chunk still in flight for the closed subscription
     * are read and dropped (a chunk by its subscription id, the answer by its correlation id). */
    void unsubscribeLater() {
        if (subscription < 0) {
            return;
        }
        Frame f = request(UNSUBSCRIBE).u8(subscription);
        waitingKey = 0;  // no answer awaited: an RPC that follows sets its own
        send(f);
        subscription = -1;
        chunks.clear();
    }

    /** The first user chunk a one-credit subscription at the spec gets within {@code waitMs} (null: none). */
    byte[] firstChunk(String stream, int offsetType, long value, long waitMs) {
        subscribe(stream, offsetType, value, 1);
        boolean ok = false;
        try {
            long deadline = System.currentTimeMillis() + waitMs;
            while (true) {
                byte[] c = nextChunk(Math.max(1, deadline - System.currentTimeMillis()), true);
                if (c == null || Chunks.chunkType(c) == Chunks.USER) {
                    ok = true;
                    return c;
                }
                credit(1);
            }
        } finally {
            if (ok) {
                unsubscribeLater();
            } else {
                unsubscribe();
            }
        }
    }

    /** One past the last record of the stream's last committed user chunk (-1: nothing committed). */
    long committedEnd(String stream, long waitMs) {
        Long committed = stats(stream).get("committed_chunk_id");
        if (committed == null || committed < 0) {
            return -1;
        }
        byte[] c = firstChunk(stream, OFFSET_LAST, 0, waitMs);
        if (c == null) {
            throw new StreamError(where + ": no chunk of stream '" + stream + "' within " + waitMs / 1000.0 + " s", 0);
        }
        return Chunks.chunkId(c) + Chunks.recordCount(c);
    }

    /** The offset of the stream's first message (-1: none). */
    long firstOffset(String stream, long waitMs) {
        Long committed = stats(stream).get("committed_chunk_id");
        if (committed == null || committed < 0) {
            return -1;
        }
        byte[] c = firstChunk(stream, OFFSET_FIRST, 0, waitMs);
        return c == null ? -1 : Chunks.chunkId(c);
    }

    /** The first offset of the first chunk written at or after {@code ms} (-1: none within waitMs). */
    long offsetAt(String stream, long ms, long waitMs) {
        byte[] c = firstChunk(stream, OFFSET_TIMESTAMP, ms, waitMs);
        return c == null ? -1 : Chunks.chunkId(c);
    }

    /** The timestamp (ms) of the stream's last user chunk, or Long.MIN_VALUE when none came. */
    long lastChunkTimestamp(String stream, long waitMs) {
        byte[] c = firstChunk(stream, OFFSET_LAST, 0, waitMs);
        return c == null ? Long.MIN_VALUE : Chunks.timestamp(c);
    }

    @Override
    public void close() {
        try {
            if (!socket.isClosed()) {
                rpc(request(CLOSE).u16(CODE_OK).str("OK"), Math.min(timeoutMs, 5000));
            }
        } catch (RuntimeException ignored) {
            // the socket is closed below in any case
        } finally {
            closeQuietly(socket);
        }
    }

    // -- IO -----------------------------------------------------------------------------------------

    /** A frame under construction: its size is written by {@link #send}. */
    static final class Frame {
        ByteBuffer buf = ByteBuffer.allocate(256);

        private void room(int n) {
            if (buf.remaining() < n) {
                ByteBuffer bigger = ByteBuffer.allocate(Math.max(buf.capacity() * 2, buf.position() + n));
                buf.flip();
                bigger.put(buf);
                buf = bigger;
            }
        }

        Frame u8(int v) {
            room(1);
            buf.put((byte) v);
            return this;
        }

        Frame u16(int v) {
            room(2);
            buf.putShort((short) v);
            return this;
        }

        Frame i32(int v) {
            room(4);
            buf.putInt(v);
            return this;
        }

        Frame i64(long v) {
            room(8);
            buf.putLong(v);
            return this;
        }

        Frame str(String s) {
            byte[] b = s.getBytes(StandardCharsets.UTF_8);
            if (b.length > Short.MAX_VALUE) {
                throw new IllegalArgumentException("a string of " + b.length + " bytes does not fit the protocol");
            }
            room(2 + b.length);
            buf.putShort((short) b.length).put(b);
            return this;
        }

        Frame bytes(byte[] b) {
            room(4 + b.length);
            buf.putInt(b.length).put(b);
            return this;
        }
    }

    private Frame request(int key) {
        correlation++;
        waitingKey = key;
        waitingCorrelation = correlation;
        return new Frame().u16(key).u16(1).i32(correlation);
    }

    private void send(Frame f) {
        int n = f.buf.position();
        byte[] raw = new byte[4 + n];
        ByteBuffer.wrap(raw).putInt(n).put(f.buf.array(), 0, n);
        try {
            out.write(raw);
            out.flush();
        } catch (IOException e) {
            throw new StreamError(where + ": sending failed: " + e.getMessage(), 0);
        }
    }

    private ByteBuffer rpc(Frame f) {
        return rpc(f, timeoutMs);
    }

    /** An RPC whose response has no response code (metadata): the body after the correlation id. */
    private ByteBuffer rpcNoCode(Frame f) {
        return exchange(f, timeoutMs);
    }

    /** Send {@code f} and read frames until its response comes (within waitMs); the body after the
     * correlation id. */
    private ByteBuffer exchange(Frame f, int waitMs) {
        reply = null;
        send(f);
        try {
            socket.setSoTimeout(waitMs);
            while (reply == null) {
                readFrame();
            }
        } catch (SocketTimeoutException e) {
            throw new StreamError(where + ": no answer from the broker", 0);
        } catch (IOException e) {
            throw new StreamError(where + ": the connection failed: " + e.getMessage(), 0);
        }
        ByteBuffer r = reply;
        reply = null;
        return r;
    }

    private ByteBuffer rpc(Frame f, int waitMs) {
        int key = waitingKey;
        ByteBuffer r = exchange(f, waitMs);
        int code = r.getShort() & 0xffff;
        if (code != CODE_OK) {
            throw new StreamError(where + ": command 0x" + Integer.toHexString(key) + " failed: " + codeName(code), code);
        }
        return r;
    }

    static String codeName(int code) {
        switch (code) {
            case 2: return "STREAM_DOES_NOT_EXIST";
            case 6: return "STREAM_NOT_AVAILABLE";
            case 8: return "AUTHENTICATION_FAILURE";
            case 12: return "VIRTUAL_HOST_ACCESS_FAILURE";
            case 16: return "ACCESS_REFUSED";
            case 17: return "PRECONDITION_FAILED";
            case 19: return "NO_OFFSET";
            default: return "code " + code;
        }
    }

    private static String readStr(ByteBuffer b) {
        int n = b.getShort();
        if (n < 0) {
            return null;
        }
        byte[] raw = new byte[n];
        b.get(raw);
        return new String(raw, StandardCharsets.UTF_8);
    }

    private void readFrame() throws IOException {
        int size;
        try {
            size = in.readInt();
        } catch (EOFException e) {
            throw new StreamError(where + " closed the connection", 0);
        }
        if (size < 4 || size > MAX_FRAME_BYTES) {
            throw new StreamError(where + ": a frame of " + size + " bytes", 0);
        }
        int rawKey = in.readUnsignedShort();
        int version = in.readUnsignedShort();
        int key = rawKey & 0x7fff;
        boolean response = (rawKey & 0x8000) != 0;
        if (key == DELIVER && !response) {
            int sub = in.readUnsignedByte();
            int rest = size - 5;
            if (version == 2) {
                in.readLong();
                rest -= 8;
            }
            byte[] chunk = new byte[rest];
            in.readFully(chunk);
            if (sub == subscription) {
                if (credit <= 0) {
                    throw new StreamError(where + " delivered a chunk without credit", 0);
                }
                credit--;
                chunks.add(chunk);
            }
            return;
        }
        byte[] body = new byte[size - 4];
        in.readFully(body);
        ByteBuffer b = ByteBuffer.wrap(body);
        if (key == TUNE && !response) {
            tuneFrameMax = b.getInt();
            tuneHeartbeat = b.getInt();
        } else if (key == HEARTBEAT) {
            send(new Frame().u16(HEARTBEAT).u16(1));
        } else if (key == CLOSE && !response) {
            int corr = b.getInt();
            int code = b.getShort() & 0xffff;
            String reason = readStr(b);
            send(new Frame().u16(0x8000 | CLOSE).u16(1).i32(corr).u16(CODE_OK));
            throw new StreamError(where + " closed the connection: " + codeName(code) + " " + reason, code);
        } else if (key == METADATA_UPDATE) {
            int code = b.getShort() & 0xffff;
            throw new StreamError(where + ": stream '" + readStr(b) + "' is no longer available ("
                    + codeName(code) + ")", code);
        } else if (key == CREDIT && response) {
            int code = b.getShort() & 0xffff;
            throw new StreamError(where + ": credit refused: " + codeName(code), code);
        } else if (response && key == waitingKey && b.remaining() >= 4 && b.getInt() == waitingCorrelation) {
            reply = b;
        }
    }
}
