package hutch.spark.jvm;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.math.BigInteger;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.PKCS8EncodedKeySpec;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SNIHostName;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;
import javax.net.ssl.TrustManager;
import javax.net.ssl.TrustManagerFactory;
import javax.net.ssl.X509TrustManager;

/**
 * TLS for the JVM reader ({@code amqps://} uris): an {@link SSLContext} from the uri's PEM files, with the
 * Python source's rules ({@code AmqpUri.ssl_context}, RabbitMQ's query parameters): {@code cacertfile} the
 * CAs to verify the broker with (none: the JVM's default trust store), {@code certfile} and
 * {@code keyfile} a client certificate chain and its key (PKCS#8, or the traditional RSA and EC forms
 * OpenSSL and trustme write), {@code verify=verify_none} no verification at all, and
 * {@code server_name_indication} the name the broker's certificate must carry (default: the uri's host;
 * also sent as SNI when it is a name, not an address).
 *
 * <p>Contexts are built once per set of settings per JVM ({@link #CONTEXTS}); a file that cannot be read
 * or parsed fails the read with its path and why.
 */
final class Tls {
    private static final Map<String, SSLContext> CONTEXTS = new ConcurrentHashMap<>();
    private static final Pattern PEM = Pattern.compile(
            "-----BEGIN ([A-Z0-9 ]+)-----([A-Za-z0-9+/=\\s]+)-----END \\1-----");

    private Tls() {
    }

    /** {@code raw} (connected) wrapped in a client TLS socket for {@code host}; the handshake is the caller's. */
    static SSLSocket wrap(ReadOptions o, Socket raw, String host, int port) throws IOException {
        SSLContext ctx = context(o);
        String name = o.serverName.isEmpty() ? host : o.serverName;
        SSLSocket s = (SSLSocket) ctx.getSocketFactory().createSocket(raw, name, port, true);
        SSLParameters p = s.getSSLParameters();
        if (o.verify) {
            p.setEndpointIdentificationAlgorithm("HTTPS");  // the certificate must name `name`
        }
        if (!name.isEmpty() && !Character.isDigit(name.charAt(name.length() - 1)) && !name.contains(":")) {
            p.setServerNames(List.of(new SNIHostName(name)));
        }
        s.setSSLParameters(p);
        return s;
    }

    static SSLContext context(ReadOptions o) {
        String key = o.cacertfile + "\0" + o.certfile + "\0" + o.keyfile + "\0" + o.verify;
        return CONTEXTS.computeIfAbsent(key, k -> build(o));
    }

    private static SSLContext build(ReadOptions o) {
        try {
            TrustManager[] trust;
            if (!o.verify) {
                trust = new TrustManager[] {new TrustAll()};
            } else {
                TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
                if (o.cacertfile.isEmpty()) {
                    tmf.init((KeyStore) null);
                } else {
                    KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
                    ks.load(null, null);
                    int i = 0;
                    for (Certificate c : certificates(o.cacertfile)) {
                        ks.setCertificateEntry("ca" + i++, c);
                    }
                    tmf.init(ks);
                }
                trust = tmf.getTrustManagers();
            }
            KeyManagerFactory kmf = null;
            if (!o.certfile.isEmpty()) {
                List<Certificate> chain = new ArrayList<>(certificates(o.certfile));
                PrivateKey pk = privateKey(o.keyfile.isEmpty() ? o.certfile : o.keyfile);
                KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
                ks.load(null, null);
                char[] none = new char[0];
                ks.setKeyEntry("client", pk, none, chain.toArray(new Certificate[0]));
                kmf = KeyManagerFactory.getInstance(KeyManagerFactory.getDefaultAlgorithm());
                kmf.init(ks, none);
            }
            SSLContext ctx = SSLContext.getInstance("TLS");
            ctx.init(kmf == null ? null : kmf.getKeyManagers(), trust, null);
            return ctx;
        } catch (GeneralSecurityException | IOException e) {
            throw ReadOptions.error("TLS settings of option 'uri': " + e.getMessage());
        }
    }

    private static Collection<? extends Certificate> certificates(String path) throws IOException,
            GeneralSecurityException {
        byte[] raw = read(path, "certificate");
        Collection<? extends Certificate> out;
        try (InputStream in = new ByteArrayInputStream(raw)) {
            out = CertificateFactory.getInstance("X.509").generateCertificates(in);
        }
        if (out.isEmpty()) {
            throw ReadOptions.error("TLS settings of option 'uri': no certificate in " + path);
        }
        return out;
    }

    private static byte[] read(String path, String what) {
        try {
            return Files.readAllBytes(Paths.get(path));
        } catch (IOException e) {
            throw ReadOptions.error("TLS settings of option 'uri': cannot read the " + what + " file " + path
                    + ": " + e);
        }
    }

    /** The private key of a PEM file: PKCS#8 ("PRIVATE KEY"), PKCS#1 ("RSA PRIVATE KEY") or SEC1 ("EC
     * PRIVATE KEY"), the last two wrapped into PKCS#8. An encrypted key is refused. */
    static PrivateKey privateKey(String path) throws GeneralSecurityException {
        String text = new String(read(path, "key"), StandardCharsets.US_ASCII);
        Matcher m = PEM.matcher(text);
        while (m.find()) {
            String kind = m.group(1);
            if (!kind.endsWith("PRIVATE KEY")) {
                continue;
            }
            byte[] der = Base64.getMimeDecoder().decode(m.group(2));
            switch (kind) {
                case "PRIVATE KEY":
                    return pkcs8(der);
                case "RSA PRIVATE KEY":
                    return KeyFactory.getInstance("RSA").generatePrivate(new PKCS8EncodedKeySpec(
                            Der.seq(Der.integer0(), Der.seq(Der.oid(RSA), Der.NULL), Der.octets(der))));
                case "EC PRIVATE KEY":
                    return KeyFactory.getInstance("EC").generatePrivate(new PKCS8EncodedKeySpec(
                            Der.seq(Der.integer0(), Der.seq(Der.oid(EC), Der.curveOf(der)), Der.octets(der))));
                default:
                    throw ReadOptions.error("TLS settings of option 'uri': the key in " + path + " is a '" + kind
                            + "' (an encrypted key cannot be used: decrypt it, e.g. openssl pkey)");
            }
        }
        throw ReadOptions.error("TLS settings of option 'uri': no private key in " + path);
    }

    private static final byte[] RSA = {0x2a, (byte) 0x86, 0x48, (byte) 0x86, (byte) 0xf7, 0x0d, 0x01, 0x01, 0x01};
    private static final byte[] EC = {0x2a, (byte) 0x86, 0x48, (byte) 0xce, 0x3d, 0x02, 0x01};

    private static PrivateKey pkcs8(byte[] der) throws GeneralSecurityException {
        for (String alg : new String[] {"RSA", "EC", "Ed25519", "Ed448", "DSA"}) {
            try {
                return KeyFactory.getInstance(alg).generatePrivate(new PKCS8EncodedKeySpec(der));
            } catch (GeneralSecurityException ignored) {
                // not this algorithm: the next
            }
        }
        throw new GeneralSecurityException("a PKCS#8 key of an algorithm this JVM does not read");
    }

    /** The few DER encodings wrapping a traditional key into PKCS#8 needs. */
    static final class Der {
        static final byte[] NULL = {0x05, 0x00};

        private Der() {
        }

        static byte[] tlv(int tag, byte[]... parts) {
            int n = 0;
            for (byte[] p : parts) {
                n += p.length;
            }
            byte[] len = n < 0x80 ? new byte[] {(byte) n} : lengthBytes(n);
            byte[] out = new byte[1 + len.length + n];
            out[0] = (byte) tag;
            System.arraycopy(len, 0, out, 1, len.length);
            int at = 1 + len.length;
            for (byte[] p : parts) {
                System.arraycopy(p, 0, out, at, p.length);
                at += p.length;
            }
            return out;
        }

        private static byte[] lengthBytes(int n) {
            byte[] b = BigInteger.valueOf(n).toByteArray();
            int skip = b[0] == 0 ? 1 : 0;
            byte[] out = new byte[1 + b.length - skip];
            out[0] = (byte) (0x80 | (b.length - skip));
            System.arraycopy(b, skip, out, 1, b.length - skip);
            return out;
        }

        static byte[] seq(byte[]... parts) {
            return tlv(0x30, parts);
        }

        static byte[] integer0() {
            return new byte[] {0x02, 0x01, 0x00};
        }

        static byte[] oid(byte[] body) {
            return tlv(0x06, body);
        }

        static byte[] octets(byte[] body) {
            return tlv(0x04, body);
        }

        /** The named curve's OID (whole TLV) of a SEC1 ECPrivateKey: its [0] parameters. */
        static byte[] curveOf(byte[] sec1) throws GeneralSecurityException {
            int[] at = {0};
            header(sec1, at, 0x30);
            while (at[0] < sec1.length) {
                int tag = sec1[at[0]] & 0xff;
                int start = at[0];
                int len = header(sec1, at, tag);
                if (tag == 0xa0) {
                    int inner = at[0];
                    int ilen = header(sec1, at, 0x06);
                    byte[] out = new byte[at[0] + ilen - inner];
                    System.arraycopy(sec1, inner, out, 0, out.length);
                    return out;
                }
                at[0] += len;
                if (at[0] <= start) {
                    break;
                }
            }
            throw new GeneralSecurityException("an EC key without its named curve");
        }

        /** Read a tag and length at at[0] (checking the tag), leave at[0] on the contents; their length. */
        private static int header(byte[] b, int[] at, int tag) throws GeneralSecurityException {
            if (at[0] + 2 > b.length || (b[at[0]] & 0xff) != tag) {
                throw new GeneralSecurityException("a damaged EC key");
            }
            int p = at[0] + 1;
            int len = b[p++] & 0xff;
            if (len >= 0x80) {
                int k = len & 0x7f;
                if (k == 0 || k > 3 || p + k > b.length) {
                    throw new GeneralSecurityException("a damaged EC key");
                }
                len = 0;
                for (int i = 0; i < k; i++) {
                    len = (len << 8) | (b[p++] & 0xff);
                }
            }
            if (p + len > b.length) {
                throw new GeneralSecurityException("a damaged EC key");
            }
            at[0] = p;
            return len;
        }
    }

    /** verify_none: every certificate accepted (the uri asked for it). */
    private static final class TrustAll implements X509TrustManager {
        @Override
        public void checkClientTrusted(X509Certificate[] chain, String authType) {
            // not a server
        }

        @Override
        public void checkServerTrusted(X509Certificate[] chain, String authType) {
            // verify_none
        }

        @Override
        public X509Certificate[] getAcceptedIssuers() {
            return new X509Certificate[0];
        }
    }
}
